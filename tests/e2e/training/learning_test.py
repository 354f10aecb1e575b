#!/usr/bin/env python3
"""The tiny model learns a language with a known entropy (standard library only).

Generates the synthetic language of synthetic_language.py (rule "copy3": the next
symbol is a fixed permutation of the one three back, with 10% noise), trains the `tiny` preset on it
with `dstrain train` at 2 ranks, and requires the final validation loss to be within
TOL = 0.05 nats of the expected loss of the true distribution,

    L*(T) = (2 ln 16 + (T - 2) H) / T,   H = -p ln p - 15 (eps/16) ln(eps/16),
    p = 1 - eps + eps/16,

where the first two targets of each sample cannot see the symbol three back (their
best loss is ln 16; derivation in synthetic_language.py). A model that learned only
symbol frequencies or bigrams stays at ln 16 = 2.77: only attention to the symbol
three back lowers it.
The loss cannot go far below L* without memorising the validation file, which the
model never sees in training (a different seed); the bound is two-sided.

usage: learning_test.py DSTRAIN DECK GENERATOR WORKDIR -- LAUNCHER...
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import synthetic_language as lang  # noqa: E402 (after the line above)

TOL = 0.05          # nats, the bound on the gap to the language's entropy
SEQ_LEN = 32        # short samples: most of the signal per token, few blind targets
EPS = 0.1           # noise: H = 0.565 nats
TRAIN_SAMPLES = 8192
VALID_SAMPLES = 2048  # 65536 targets: the true distribution's loss on them is within
                      # ~0.006 (one standard error) of L*, see the printed value


def main():
    sep = sys.argv.index("--")
    dstrain, deck, generator, work = sys.argv[1:sep]
    launch = sys.argv[sep + 1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data")
    subprocess.run([sys.executable, generator, "generate", data, "--seq-len", str(SEQ_LEN),
                    "--train-samples", str(TRAIN_SAMPLES), "--valid-samples", str(VALID_SAMPLES),
                    "--eps", str(EPS)], check=True)
    target = lang.expected_loss(SEQ_LEN, EPS)
    out = os.path.join(work, "run")
    cmd = [*launch, dstrain, "train", deck, "--set", f"data.train={data}/train.txt",
           "--set", f"data.valid={data}/valid.txt", "--set", f"data.seq_len={SEQ_LEN}",
           "--set", f"run.output_dir={out}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        print(f"FAILED: dstrain train exited {r.returncode}")
        return 1
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    steps = [x for x in recs if x.get("type") == "step"]
    evals = [x for x in recs if x.get("type") == "eval"]
    if not steps or not evals:
        print("FAILED: metrics.jsonl has no step or no eval records")
        return 1
    final = evals[-1]
    if final["step"] != steps[-1]["step"]:
        print(f"FAILED: the last evaluation is at step {final['step']}, not the last step "
              f"{steps[-1]['step']}")
        return 1
    tokens_expected = VALID_SAMPLES * SEQ_LEN
    if final["val_tokens"] != tokens_expected:
        print(f"FAILED: the evaluation covered {final['val_tokens']} targets, expected all "
              f"{tokens_expected} of valid.txt (eval.batches x micro-batch x ranks samples)")
        return 1
    loss = final["val_loss"]
    gap = loss - target
    curve = ", ".join(f"{x['step']}: {x['val_loss']:.3f}" for x in evals)
    print(f"validation loss by step: {curve}")
    print(f"learning: {final['step']} steps in {seconds:.0f} s; final validation loss "
          f"{loss:.4f}, expected loss of the true distribution L* = {target:.4f} nats "
          f"(H = {lang.entropy(EPS):.4f}, seq_len {SEQ_LEN}); |loss - L*| = {abs(gap):.4f}, "
          f"bound {TOL} (margin {TOL - abs(gap):.4f})")
    if abs(gap) > TOL:
        what = ("has not learned the three-back dependence well enough" if gap > 0 else
                "is below the entropy of the language: the loss is not the mean over every "
                "target, or validation data leaked into training")
        print(f"FAILED: the tiny model {what}: |{loss:.4f} - {target:.4f}| = {abs(gap):.4f} > "
              f"{TOL} nats after {final['step']} steps")
        return 1
    print("learning test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
