#!/usr/bin/env python3
"""Gradient accumulation equals data parallelism: the same global batch trained as
np=1 x accum 4, np=2 x accum 2 and np=4 x accum 1 (micro-batch 2, global batch 8)
must give the same run. After 10 steps:

  step losses (metrics.jsonl):        relative difference <= 1e-5
  every tensor of final-params.h5:    relative L2 difference <= 1e-5 (vs np=1)

Why 1e-5 and not bit equality: the layouts sum the same micro-batch gradients in a
different order (local accumulation first, then the all-reduce), so they differ by fp32
rounding, 6e-8 relative per addition, over a handful of additions per element; ten
AdamW steps carry that into the parameters without amplifying it much (the update is
m / sqrt(v), a ratio of sums that are each perturbed alike). A wrong gradient scale (a
sum instead of a mean over ranks or micro-batches), a sample seen twice or missed, or a
rank-dependent schedule moves losses and parameters by 1e-3 or more.

That the per-rank shards are disjoint and cover the global batch is tested directly in
tests/mpi/data (the sampler); this test checks the whole training step end to end.

The data-parallel layouts run on both gradient back ends: shared memory (what auto picks
for ranks on one node) and MPI. On two ranks they must agree bit for bit (each element's
sum is one addition, a + b == b + a); on four, within the tolerance above (MPI chooses
its own summation order).

usage: rank_invariance.py DSTRAIN DECK GENERATOR WORKDIR [KEY=VALUE...] -- MPIEXEC
       NUMPROC_FLAG [PREFLAGS...]
The KEY=VALUE overrides change the model of every run (a DeepSeekMoE model: its expert
loads are all-reduced over the data group, so the routers' correction biases must move
alike in every layout).
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

from training_e2e import rel_l2, setup

TOL_LOSS = 1e-5
TOL_PARAM = 1e-5
STEPS = 10
SEQ, MICRO, GLOBAL = 64, 2, 8
LAYOUTS = [(1, 4), (2, 2), (4, 1)]  # (ranks, accumulation steps)
# Each data-parallel layout again with the gradients summed by MPI instead of shm.
MPI_LAYOUTS = [(2, 2), (4, 1)]


def main():
    st = setup(SEQ)
    dstrain, deck, work, data = st.dstrain, st.deck, st.work, st.data
    mpiexec, numproc_flag, preflags = *st.launch, st.preflags
    model_sets = st.extra
    runs = {}
    for ranks, accum, backend in [(r, a, "auto") for r, a in LAYOUTS] + \
            [(r, a, "mpi") for r, a in MPI_LAYOUTS]:
        out = os.path.join(work, f"np{ranks}-{backend}")
        cmd = [mpiexec, numproc_flag, str(ranks), "--oversubscribe", *preflags, dstrain, "train",
               deck, "--set", f"data.train={data}/train.txt", "--set", f"data.valid={data}/valid.txt",
               "--set", "data.text_separator=", "--set", f"data.seq_len={SEQ}",
               "--set", f"training.micro_batch_size={MICRO}",
               "--set", f"training.global_batch_size={GLOBAL}",
               "--set", f"training.max_steps={STEPS}", "--set", "training.schedule.warmup_steps=2",
               "--set", "logging.every_steps=1", "--set", "eval.every_steps=0",
               "--set", "eval.batches=1", "--set", f"run.output_dir={out}",
               "--set", f"parallel.backend={backend}"]
        for m in model_sets:
            cmd += ["--set", m]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print(f"FAILED: np={ranks} ({backend}) run exited {r.returncode}")
            return 1
        comm = "mpi" if backend == "mpi" or ranks == 1 else "shm"
        for want in (f"micro-batch {MICRO} x {accum} accumulation x {ranks} data ranks",
                     f"| comm {comm} |"):
            if want not in r.stdout + r.stderr:
                print(r.stdout + r.stderr)
                print(f"FAILED: np={ranks} ({backend}): the log does not say '{want}'")
                return 1
        with open(os.path.join(out, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        # With a multi-token prediction module its loss is compared like the main one.
        losses = [r["loss"] for r in recs if r.get("type") == "step"] + \
            [r["mtp_loss"] for r in recs if r.get("type") == "step" and "mtp_loss" in r]
        with h5py.File(os.path.join(out, "final-params.h5"), "r") as f:
            params = {k: np.array(f["params"][k]) for k in f["params"]}
        runs[(ranks, backend)] = (losses, params)

    problems = []
    # Two ranks, shm against MPI: the same bits.
    shm_losses, shm_params = runs[(2, "auto")]
    mpi_losses, mpi_params = runs[(2, "mpi")]
    if shm_losses != mpi_losses:
        problems.append(f"np=2: shm losses {shm_losses} differ from MPI's {mpi_losses}")
    differing = [k for k in mpi_params if not np.array_equal(shm_params.get(k), mpi_params[k])]
    if differing:
        problems.append(f"np=2: {len(differing)} tensors differ between shm and MPI, first "
                        f"{differing[0]}")
    else:
        print(f"np=2: shm and MPI give bit-identical losses and {len(mpi_params)} tensors")
    ref_losses, ref_params = runs[(1, "auto")]
    want = STEPS * (2 if any("mtp_depth=1" in m for m in model_sets) else 1)
    if len(ref_losses) != want:
        problems.append(f"np=1 logged {len(ref_losses)} step losses, expected {want}")
    for ranks, accum, backend in [(r, a, "auto") for r, a in LAYOUTS[1:]] + \
            [(r, a, "mpi") for r, a in MPI_LAYOUTS]:
        losses, params = runs[(ranks, backend)]
        name = (f"np={ranks} x accum {accum} ({'mpi' if backend == 'mpi' else 'shm'}) "
                f"vs np=1 x accum 4")
        if len(losses) != len(ref_losses):
            problems.append(f"{name}: {len(losses)} losses vs {len(ref_losses)}")
        worst_loss = 0.0
        for step, (a, b) in enumerate(zip(losses, ref_losses), start=1):
            err = abs(a - b) / abs(b)
            worst_loss = max(worst_loss, err)
            if err > TOL_LOSS:
                problems.append(f"{name}: step {step} loss {a!r} vs {b!r} (relative {err:.2e} > "
                                f"{TOL_LOSS:g})")
        if sorted(params) != sorted(ref_params):
            problems.append(f"{name}: different tensor names in final-params.h5")
        worst = ("", 0.0)
        for k in ref_params:
            if k not in params:
                continue
            if params[k].shape != ref_params[k].shape:
                problems.append(f"{name}: {k} shape {params[k].shape} vs {ref_params[k].shape}")
                continue
            err = rel_l2(params[k], ref_params[k])
            worst = max(worst, (k, err), key=lambda t: t[1])
            if err > TOL_PARAM:
                problems.append(f"{name}: {k} relative L2 {err:.2e} > {TOL_PARAM:g}")
        print(f"{name}: {len(losses)} losses, worst relative difference {worst_loss:.2e}; "
              f"{len(params)} tensors, worst {worst[0]} relative L2 {worst[1]:.2e}")
    print("losses np=1: " + " ".join(f"{x:.6f}" for x in ref_losses))
    if problems:
        print("\n".join(problems))
        print("FAILED: accumulation and data parallelism do not give the same run")
        return 1
    print(f"rank invariance: np=1 x 4 == np=2 x 2 == np=4 x 1 within {TOL_LOSS:g} (losses) and "
          f"{TOL_PARAM:g} (parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
