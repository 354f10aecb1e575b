#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on the same model, batch and machine as a dstrain run:
the reference ddp_compare.sh measures dstrain against.

Hugging Face transformers' LlamaForCausalLM built from a dstrain preset (the dense
DeepSeek-LLM shape: RMSNorm, RoPE, SwiGLU, untied head; eager attention, fp32; the same
config mapping as tests/oracle/llama_parity.py), wrapped in DDP over the gloo back end,
N processes x 1 thread (torch.set_num_threads(1)), AdamW with dstrain's defaults
(betas 0.9/0.95, weight decay 0.1), gradient clipping at 1.0 as dstrain does. Random
byte-level tokens (the throughput does not depend on their values). Each rank trains
on its micro-batch of MICRO sequences of SEQ tokens per step.

Prints one JSON line: tokens/s over the timed steps (all ranks together; the median of
per-step rates), the model FLOPs per token by dstrain's definition (docs/performance.md),
model GFLOP/s.

usage: ddp_reference.py --preset tiny|small --ranks N --micro B --seq T --steps S --warmup W
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

PRESETS = {  # docs/deck.md, "Model presets"
    "tiny": dict(vocab_size=260, d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=688,
                 max_seq_len=256),
    "small": dict(vocab_size=4096, d_model=512, n_layers=8, n_heads=8, n_kv_heads=8,
                  ffn_dim=1376, max_seq_len=512),
}


def flops_per_token(p, seq):
    """dstrain's model FLOPs (lib/model/plan.cpp training_flops_per_token): 6 x the
    non-embedding parameters (output head included) + 12 x n_layers x seq x d_model."""
    d, f, L, V = p["d_model"], p["ffn_dim"], p["n_layers"], p["vocab_size"]
    hd = d // p["n_heads"]
    attn = d * d + 2 * d * p["n_kv_heads"] * hd + d * d
    layer = attn + 3 * d * f + 2 * d
    non_embedding = L * layer + d + V * d  # layers, final norm, output head
    return 6.0 * non_embedding + 12.0 * L * seq * d


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, a, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    p = PRESETS[a.preset]
    cfg = LlamaConfig(vocab_size=p["vocab_size"], hidden_size=p["d_model"],
                      intermediate_size=p["ffn_dim"], num_hidden_layers=p["n_layers"],
                      num_attention_heads=p["n_heads"], num_key_value_heads=p["n_kv_heads"],
                      max_position_embeddings=p["max_seq_len"], rms_norm_eps=1e-6,
                      rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                      attention_bias=False, mlp_bias=False, attn_implementation="eager")
    torch.manual_seed(1234)
    model = DDP(LlamaForCausalLM(cfg).float())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, 256, (a.micro, a.seq + 1), generator=g)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    rates = []
    for step in range(a.warmup + a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets during backward
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dist.barrier()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            rates.append(a.ranks * a.micro * a.seq / dt)
    if rank == 0:
        queue.put(rates)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--micro", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a, port, queue)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    rates = queue.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            print(f"ddp_reference: a worker exited {p.exitcode}", file=sys.stderr)
            return 1
    tps = statistics.median(rates)
    fpt = flops_per_token(PRESETS[a.preset], a.seq)
    print(json.dumps({"impl": "pytorch-ddp", "preset": a.preset, "ranks": a.ranks,
                      "micro": a.micro, "seq": a.seq, "tokens_per_s": tps,
                      "flops_per_token": fpt, "gflops": fpt * tps / 1e9}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
