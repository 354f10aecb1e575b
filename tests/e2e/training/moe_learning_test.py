#!/usr/bin/env python3
"""DeepSeekMoE learns at least as well as the dense model of (at least) its active FLOPs,
with balanced experts (standard library only).

Trains `tiny-moe` (latent attention with a 64-wide KV latent, one dense block and three
DeepSeekMoE blocks of 8 routed experts, top-2, plus one shared: a token's active expert
width 3 x 224 = 672) and `tiny` (dense: multi-head attention, SwiGLU of ffn_dim 688 in
every block) on the demo corpus (Debian's fortunes, scripts/prepare-demo-data, read as
text) with the demo deck's optimizer and schedule, the same samples in the same order,
the same steps. At data.seq_len 64 `dstrain check` gives tiny 20.2 M training FLOPs per
token and tiny-moe 19.2 M (active parameters, docs/performance.md): the dense model
spends 5% more. (docs/model.md also compares tiny-moe with its dense twin, the same
latent attention with the dense MLP in every block, 19.4 M.)

Requires:
  - tiny-moe's final validation loss <= tiny's (the same 32 x 16 validation sequences of
    64 tokens);
  - balanced load after the balancing's warm-up (the first half of the run): every MoE
    block's busiest expert, as a multiple of the mean tokens per expert (max/mean in
    metrics.jsonl, each step's global batch), averages < 1.5 over the second half's
    steps, and no step collapses a block (< 2.0, where all tokens on the top-2 experts
    of 8 give 4.0).
The correction bias moves at model.moe.bias_update_rate 0.01: at the default 1e-3 (what
DeepSeek-V3 used over 14.8 T tokens) a 100-step run ends with the last block collapsed
(max/mean 3.9, measured), the bias having moved by 0.1 at most.

usage: moe_learning_test.py DSTRAIN DECK PREPARE_DEMO_DATA WORKDIR -- LAUNCHER...
"""
import json
import os
import shutil
import subprocess
import sys

STEPS = 100
WARMUP = 10         # the learning rate's warm-up (the demo deck's)
SEQ_LEN = 64
BATCH = 32          # sequences per step: 2048 tokens, 512 expert slots per expert
BALANCE = 1.5       # the bound on max/mean expert load after warm-up
COLLAPSE = 2.0      # no single step above this


def train(dstrain, deck, data, out, launch, sets):
    cmd = launch + [dstrain, "train", deck,
                    "--set", f"data.train={data}/fortunes-train.txt",
                    "--set", f"data.valid={data}/fortunes-valid.txt",
                    "--set", "data.format=text", "--set", f"data.seq_len={SEQ_LEN}",
                    "--set", f"training.max_steps={STEPS}",
                    "--set", f"training.global_batch_size={BATCH}", "--set", "eval.batches=32",
                    "--set", f"training.schedule.warmup_steps={WARMUP}",
                    "--set", "logging.every_steps=1", "--set", f"eval.every_steps={STEPS}",
                    "--set", "checkpoint.every_steps=0", "--set", "checkpoint.resume=none",
                    "--set", f"run.output_dir={out}"]
    for x in sets:
        cmd += ["--set", x]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAILED: the {out} run exited {r.returncode}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    steps = [x for x in recs if x.get("type") == "step"]
    evals = [x for x in recs if x.get("type") == "eval"]
    if len(steps) != STEPS or not evals:
        raise SystemExit(f"FAILED: the {out} run logged {len(steps)} steps, {len(evals)} evals")
    return steps, evals[-1]["val_loss"]


def main():
    sep = sys.argv.index("--")
    dstrain, deck, prepare, work = sys.argv[1:sep]
    launch = sys.argv[sep + 1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data")
    subprocess.run([prepare, data], check=True, capture_output=True)
    dense_steps, dense_val = train(dstrain, deck, data, os.path.join(work, "tiny"), launch,
                                   ["model.preset=tiny"])
    moe_steps, moe_val = train(dstrain, deck, data, os.path.join(work, "tiny-moe"), launch,
                               ["model.preset=tiny-moe", "model.moe.bias_update_rate=0.01"])
    after = [s for s in moe_steps if s["step"] > STEPS // 2]
    blocks = len(after[0]["moe"])
    means = [sum(s["moe"][b]["max_over_mean"] for s in after) / len(after) for b in range(blocks)]
    worst = max(b["max_over_mean"] for s in after for b in s["moe"])
    print(f"tiny (dense): final train loss {dense_steps[-1]['loss']:.4f}, validation {dense_val:.4f}")
    print(f"tiny-moe: final train loss {moe_steps[-1]['loss']:.4f}, validation {moe_val:.4f}; "
          f"steps {STEPS // 2 + 1}-{STEPS}: max/mean expert load per block "
          f"{', '.join(f'{m:.3f}' for m in means)} on average, worst step {worst:.3f}")
    problems = []
    if not moe_val <= dense_val:
        problems.append(f"tiny-moe's validation loss {moe_val:.4f} > tiny's {dense_val:.4f}")
    if not max(means) < BALANCE:
        problems.append(f"an MoE block's max/mean expert load averaged {max(means):.3f} >= "
                        f"{BALANCE} after warm-up")
    if not worst < COLLAPSE:
        problems.append(f"an MoE block's max/mean expert load reached {worst:.3f} >= {COLLAPSE}")
    if problems:
        print("\n".join(problems))
        print("FAILED: moe learning test")
        return 1
    print(f"moe learning test: ok (validation {moe_val:.4f} <= tiny {dense_val:.4f} in "
          f"{STEPS} steps, load max/mean < {BALANCE} after warm-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
