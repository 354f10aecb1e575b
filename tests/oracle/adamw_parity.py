#!/usr/bin/env python3
"""Oracle: our AdamW (train::AdamW over kernels::adamw_step) against torch.optim.AdamW.

adamw_dump runs a few steps of three cases (DeepSeek-LLM's betas and decay; PyTorch's
defaults with loss-scaled, clipped gradients; gradients near eps) on a small parameter
store with a norm weight that is not decayed, and writes the initial parameters, every
step's gradients, lr and grad_scale, and our parameters and moments after every step.
torch.optim.AdamW repeats the steps from the same inputs (two param groups: decay and no
decay; the gradient given to torch is float32(grads * grad_scale), the product our kernel
forms) and after every step t every element must agree:
  params: |ours - torch| <= t * 2^-24 * (4 max|p| + 64 lr_max)
  m:      |ours - torch| <= t * 2^-22 * max|g|
  v:      |ours - torch| <= t * 2^-22 * (|v| + max|g|^2 * 2^-24)
Both evaluate the same float operations, except that ATen's vectorised CPU kernels may
fuse multiply-adds and divide in another order: a few ulps per step, which the bounds
allow with margin (2 roundings of p, ~16 ulps of an update of at most ~4 lr).
The same comparison against torch.optim.Adam with coupled L2 weight decay must FAIL on the
decayed cases, so the tolerance does tell decoupled decay from L2.

usage: adamw_parity.py ADAMW_DUMP WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import torch


def read_f32(path):
    return np.fromfile(path, dtype="<f4")


def load_case(d):
    tensors, steps, hyper = [], [], None
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            k, *rest = line.split()
            if k == "tensor":
                tensors.append((rest[0], int(rest[1]), rest[2] == "1"))
            elif k == "hyper":
                hyper = tuple(float(x) for x in rest)
            elif k == "step":
                steps.append((int(rest[0]), float(rest[1]), float(rest[2])))
    return tensors, hyper, steps


def split(flat, tensors):
    out, o = [], 0
    for _, n, _ in tensors:
        out.append(flat[o:o + n])
        o += n
    assert o == flat.size, (o, flat.size)
    return out


def run_torch(d, tensors, hyper, steps, make_opt):
    """Repeats the steps in torch; yields (t, lr, params, m, v, g) after each step."""
    beta1, beta2, eps, wd = hyper
    p0 = split(read_f32(os.path.join(d, "params_0.f32")), tensors)
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in p0]
    decay = [p for p, (_, _, dec) in zip(params, tensors) if dec]
    no_decay = [p for p, (_, _, dec) in zip(params, tensors) if not dec]
    opt = make_opt([{"params": decay, "weight_decay": wd},
                    {"params": no_decay, "weight_decay": 0.0}], (beta1, beta2), eps)
    for t, lr, grad_scale in steps:
        grads = split(read_f32(os.path.join(d, f"grads_{t}.f32")), tensors)
        g_scaled = []
        for p, g in zip(params, grads):
            gs = (g * np.float32(grad_scale)).astype(np.float32)  # one f32 product
            p.grad = torch.from_numpy(gs)
            g_scaled.append(gs)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        ps = [p.detach().numpy().copy() for p in params]
        ms = [opt.state[p]["exp_avg"].numpy().copy() for p in params]
        vs = [opt.state[p]["exp_avg_sq"].numpy().copy() for p in params]
        yield t, lr, ps, ms, vs, g_scaled


def compare(d, tensors, hyper, steps, make_opt, report):
    """Max error / bound over every step, tensor and element (<= 1 means agreement)."""
    lr_max = max(lr for _, lr, _ in steps)
    worst = 0.0
    for t, lr, ps, ms, vs, gs in run_torch(d, tensors, hyper, steps, make_opt):
        ours_p = split(read_f32(os.path.join(d, f"params_{t}.f32")), tensors)
        ours_m = split(read_f32(os.path.join(d, f"m_{t}.f32")), tensors)
        ours_v = split(read_f32(os.path.join(d, f"v_{t}.f32")), tensors)
        for i, (name, _, _) in enumerate(tensors):
            p_ref, m_ref, v_ref = (x[i].astype(np.float64) for x in (ps, ms, vs))
            g_max = float(np.max(np.abs(gs[i]))) if gs[i].size else 0.0
            bound_p = t * 2.0**-24 * (4 * float(np.max(np.abs(p_ref))) + 64 * lr_max)
            bound_m = t * 2.0**-22 * g_max + 1e-45
            bound_v = t * 2.0**-22 * (np.abs(v_ref) + g_max**2 * 2.0**-24) + 1e-45
            ratios = {
                "params": float(np.max(np.abs(ours_p[i] - p_ref)) / bound_p),
                "m": float(np.max(np.abs(ours_m[i] - m_ref)) / bound_m),
                "v": float(np.max(np.abs(ours_v[i] - v_ref) / bound_v)),
            }
            for what, r in ratios.items():
                worst = max(worst, r)
                if report and r > 1.0:
                    print(f"  FAIL step {t} {name} {what}: error / bound = {r:.3g}")
            if report and t == steps[-1][0]:
                ulps = np.abs(ours_p[i] - p_ref) / np.spacing(np.abs(ps[i]).astype(np.float32))
                print(f"  step {t} {name}: params max {float(np.max(ulps)):.1f} ulp, "
                      f"worst error/bound {max(ratios.values()):.3g}")
    return worst


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dump, work = sys.argv[1], sys.argv[2]
    subprocess.run([dump, work], check=True)
    torch.set_num_threads(1)
    with open(os.path.join(work, "cases.txt")) as f:
        cases = [c.strip() for c in f if c.strip()]
    adamw = lambda groups, betas, eps: torch.optim.AdamW(groups, betas=betas, eps=eps,
                                                          foreach=False)
    adamw_default = lambda groups, betas, eps: torch.optim.AdamW(groups, betas=betas, eps=eps)
    adam_l2 = lambda groups, betas, eps: torch.optim.Adam(groups, betas=betas, eps=eps,
                                                          foreach=False)
    ok = True
    for case in cases:
        d = os.path.join(work, case)
        tensors, hyper, steps = load_case(d)
        print(f"case {case}: betas {hyper[0]}, {hyper[1]}, eps {hyper[2]}, weight decay "
              f"{hyper[3]}, {len(steps)} steps, grad_scale {steps[0][2]}")
        worst = compare(d, tensors, hyper, steps, adamw, report=True)
        worst_default = compare(d, tensors, hyper, steps, adamw_default, report=False)
        print(f"  torch.optim.AdamW: worst error/bound {worst:.3g} (foreach=False), "
              f"{worst_default:.3g} (default implementation)")
        ok &= worst <= 1.0 and worst_default <= 1.0
        if hyper[3] > 0:
            l2 = compare(d, tensors, hyper, steps, adam_l2, report=False)
            print(f"  torch.optim.Adam with L2 decay (must differ): error/bound {l2:.3g}")
            ok &= l2 > 1.0
    print("adamw parity: all cases agree" if ok else "adamw parity: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
