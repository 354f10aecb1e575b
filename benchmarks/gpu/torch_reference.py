#!/usr/bin/env python3
"""PyTorch on the GPU, on the model and batch of benchmarks/gpu/throughput: the reference
dstrain's GPU speed is compared with (docs/gpu.md, "PyTorch on the same model").

The dense DeepSeek-LLM layout written out in plain PyTorch (no transformers needed on the
GPU machine): token embedding, per block RMSNorm -> causal self-attention with RoPE
(rotate-half pairs, theta 10000) -> residual, RMSNorm -> SwiGLU MLP -> residual; final
RMSNorm, untied output head, mean cross-entropy. Parameters fp32, compute under
torch.autocast(bfloat16) (fp32 master weights, as dstrain's bf16 runs), attention through
F.scaled_dot_product_attention (its flash back end), AdamW fused, betas 0.9/0.95, weight
decay 0.1, gradient clipping at 1.0. Random token ids (the cost of a step does not depend
on their values).

Prints one JSON line per mode: median tokens/s over the steps after the warm-up, model
TFLOP/s by dstrain's FLOPs definition (docs/performance.md), MFU against 989 TFLOP/s, and
torch.cuda.max_memory_allocated.

usage: torch_reference.py --mode eager|compile [--preset deepseek-1b] [--micro 4]
                          [--seq 2048] [--steps 30] [--warmup 10]
"""
import argparse
import json
import math
import statistics
import time

PRESETS = {  # docs/deck.md, "Model presets"
    "tiny": dict(vocab_size=260, d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=688),
    "deepseek-1b": dict(vocab_size=102400, d_model=2048, n_layers=24, n_heads=16, n_kv_heads=16,
                        ffn_dim=5504),
}
PEAK_TFLOPS = 989.0  # dense bf16, H100/H200 SXM data sheet


def flops_per_token(p, seq):
    """dstrain's model FLOPs (model::training_flops_per_token): 6 x the non-embedding
    parameters (output head included) + 12 x n_layers x seq x d_model."""
    d, f, L, V = p["d_model"], p["ffn_dim"], p["n_layers"], p["vocab_size"]
    hd = d // p["n_heads"]
    attn = d * d + 2 * d * p["n_kv_heads"] * hd + d * d
    layer = attn + 3 * d * f + 2 * d
    return 6.0 * (L * layer + d + V * d) + 12.0 * L * seq * d


def build(p, seq, torch, dev):
    nn, F = torch.nn, torch.nn.functional
    d, H, KV = p["d_model"], p["n_heads"], p["n_kv_heads"]
    hd = d // H

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * \
                self.weight.to(x.dtype)

    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(dev)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(dev)

    def rope(x):  # (B, heads, T, hd)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos.to(x.dtype) + torch.cat([-x2, x1], -1) * sin.to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(d, H * hd, bias=False)
            self.k = nn.Linear(d, KV * hd, bias=False)
            self.v = nn.Linear(d, KV * hd, bias=False)
            self.o = nn.Linear(H * hd, d, bias=False)
            self.gate = nn.Linear(d, p["ffn_dim"], bias=False)
            self.up = nn.Linear(d, p["ffn_dim"], bias=False)
            self.down = nn.Linear(p["ffn_dim"], d, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(B, T, H, hd).transpose(1, 2)
            k = self.k(h).view(B, T, KV, hd).transpose(1, 2)
            v = self.v(h).view(B, T, KV, hd).transpose(1, 2)
            a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True,
                                               enable_gqa=KV != H)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, d))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(p["vocab_size"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(p["n_layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(d, p["vocab_size"], bias=False)

        def forward(self, tokens, targets):
            x = self.emb(tokens)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    model = Model().to(dev)
    for prm in model.parameters():
        if prm.dim() > 1:
            torch.nn.init.normal_(prm, std=0.02)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], required=True)
    ap.add_argument("--preset", default="deepseek-1b", choices=sorted(PRESETS))
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cpu: a quick test of this script only")
    a = ap.parse_args()
    import torch

    torch.manual_seed(1234)
    torch.backends.cuda.matmul.allow_tf32 = True
    p = PRESETS[a.preset]
    dev = a.device
    cuda = dev == "cuda"
    model = build(p, a.seq, torch, dev)
    step_fn = torch.compile(model) if a.mode == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=cuda)
    gen = torch.Generator(device=dev).manual_seed(1)
    times, losses = [], []
    t_first = time.perf_counter()
    for step in range(a.steps):
        tok = torch.randint(0, p["vocab_size"], (a.micro, a.seq + 1), device=dev, generator=gen)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = step_fn(tok[:, :-1], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes, as a logged step does
        times.append(time.perf_counter() - t0)
    fpt = flops_per_token(p, a.seq)
    tokens = a.micro * a.seq
    rates = [tokens / t for t in times[a.warmup:]]
    tps = statistics.median(rates)
    print(json.dumps({
        "framework": "pytorch", "torch": torch.__version__, "mode": a.mode,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "preset": a.preset, "micro": a.micro,
        "seq": a.seq, "steps": a.steps, "warmup": a.warmup,
        "median_tokens_per_s": tps, "median_step_ms": 1e3 * statistics.median(times[a.warmup:]),
        "flops_per_token": fpt, "model_tflops_per_s": tps * fpt / 1e12,
        "mfu_vs_peak": tps * fpt / 1e12 / PEAK_TFLOPS,
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "first_loss": losses[0], "final_loss": losses[-1],
        "finite": all(math.isfinite(x) for x in losses),
        "wall_s": time.perf_counter() - t_first,
    }), flush=True)


if __name__ == "__main__":
    main()
