#!/usr/bin/env python3
"""Two builds of dstrain give the same bits: the check that a change meant to change no
result (a refactoring of the trainer, the model or the plan) changed none.

Each layout below trains 12 steps of the tiny decks on the synthetic corpus with both
binaries (an evaluation every 4 steps, checkpoints at steps 6 and 12), then resumes each
binary's step-6 checkpoint with that binary to step 12. Compared bit for bit between the
two binaries: every metrics.jsonl record's loss, grad_norm, lr, skipped flag, loss scale,
MoE and MTP fields (steps and evaluations), the step-12 checkpoint's tensors
(params/ and optimizer/), final-params.h5, and the resumed run's records.

The layouts: DP=2 over mpi and over shm, ZeRO 1 and 2, ZeRO 1 + EP=2 (tiny-moe), fp16 with
an injected overflow, recompute full, TP=2 + SP (tiny, and tiny-moe with latent attention),
PP=2 1f1b and interleaved, PP=2 + EP=2, tiny-moe with EP=2 and the MTP module, bf16.

usage: same_bits.py BASE_DSTRAIN NEW_DSTRAIN DECK GENERATOR WORKDIR [--only NAME,...]
                    -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
  (scripts/same-bits builds BASE_DSTRAIN from a git revision and runs this.)
Exits 0 and prints "same bits: N layouts identical" when every comparison holds.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training_e2e import read_h5  # noqa: E402

STEPS, RESUME_AT = 12, 6
SEQ, MICRO, GLOBAL = 32, 2, 8
DEADLINE_S = 90
KILL_AFTER_S = 300
# metrics.jsonl keys that are measurements of time, memory or traffic, not results.
TIMING_KEYS = ("tokens_per_s", "mfu", "step_ms", "peak_mem_bytes", "eta_s", "alltoall_ms",
               "tensor_allreduce_ms")

MOE = ["model.preset=tiny-moe"]
LAYOUTS = {
    # name: (ranks, extra --set values)
    "dp2-mpi": (2, ["parallel.backend=mpi"]),
    "dp2-shm": (2, ["parallel.backend=shm"]),
    "zero1": (2, ["parallel.backend=mpi", "parallel.zero_stage=1"]),
    "zero2": (2, ["parallel.backend=mpi", "parallel.zero_stage=2"]),
    "zero1-ep2": (2, MOE + ["parallel.backend=mpi", "parallel.zero_stage=1",
                            "parallel.expert=2"]),
    "fp16-overflow": (2, ["training.precision=fp16", "debug.inject_overflow_step=3"]),
    "recompute-full": (2, ["training.recompute=full"]),
    "tp2-sp": (2, ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
    "tp2-sp-moe-mla": (2, MOE + ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
    "pp2-1f1b": (2, ["parallel.pipeline=2"]),
    "pp2-interleaved": (2, ["parallel.pipeline=2", "parallel.pipeline_schedule=interleaved",
                            "parallel.virtual_stages=2"]),
    "pp2-ep2": (4, MOE + ["parallel.pipeline=2", "parallel.expert=2"]),
    "ep2-mtp": (2, MOE + ["parallel.expert=2", "model.mtp_depth=1"]),
    "bf16": (2, ["training.precision=bf16"]),
    "bf16-zero1-moe": (2, MOE + ["training.precision=bf16", "parallel.zero_stage=1"]),
}


def results(record):
    """A metrics record without its measurements of time, memory and traffic."""
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


class Runner:
    def __init__(self, deck, data, work, launch):
        self.deck, self.data, self.work, self.launch = deck, data, work, launch

    def train(self, binary, name, ranks, sets):
        out = os.path.join(self.work, name)
        cmd = [self.launch[0], self.launch[1], str(ranks), "--oversubscribe", *self.launch[2:],
               binary, "train", self.deck,
               "--set", f"data.train={self.data}/train.txt",
               "--set", f"data.valid={self.data}/valid.txt",
               "--set", "data.text_separator=", "--set", f"data.seq_len={SEQ}",
               "--set", f"training.micro_batch_size={MICRO}",
               "--set", f"training.global_batch_size={GLOBAL}",
               "--set", f"training.max_steps={STEPS}", "--set", "training.schedule.warmup_steps=2",
               "--set", "logging.every_steps=1", "--set", "eval.every_steps=4",
               "--set", "eval.batches=2", "--set", f"checkpoint.every_steps={RESUME_AT}",
               "--set", "checkpoint.keep_last=2", "--set", "debug.consistency_every=3",
               "--set", "parallel.bucket_mb=1",
               "--set", f"run.output_dir={out}", "--set", f"parallel.timeout_s={DEADLINE_S}"]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"FAILED: {name} still running after {KILL_AFTER_S} s: killed")
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name} exited {r.returncode}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [results(json.loads(x)) for x in f if x.strip()]
        records = [x for x in records if x.get("type") in ("step", "eval")]
        return out, records, time.monotonic() - t0


def compare(name, what, a, b, problems):
    if a == b:
        return True
    problems.append(f"{name}: {what} differ")
    return False


def main():
    argv = sys.argv
    sep = argv.index("--")
    base, new, deck, generator, work, *rest = argv[1:sep]
    launch = argv[sep + 1:]
    only = None
    if rest[:1] == ["--only"]:
        only = set(rest[1].split(","))
        unknown = only - set(LAYOUTS)
        if unknown:
            raise SystemExit(f"same_bits: unknown layouts {sorted(unknown)}; known: "
                             f"{', '.join(LAYOUTS)}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data")
    subprocess.run([sys.executable, generator, "generate", data, "--seq-len", str(SEQ),
                    "--train-samples", "256", "--valid-samples", "8"], check=True,
                   capture_output=True)
    runner = Runner(deck, data, work, launch)
    problems = []
    done = 0
    seconds = {"base": 0.0, "new": 0.0}
    for name, (ranks, sets) in LAYOUTS.items():
        if only and name not in only:
            continue
        runs = {}
        for tag, binary in (("base", base), ("new", new)):
            out, records, took = runner.train(binary, f"{name}-{tag}", ranks, sets)
            ckpt = os.path.join(out, "checkpoints", f"step-{RESUME_AT}.h5")
            _, resumed, took2 = runner.train(binary, f"{name}-{tag}-resumed", ranks,
                                             sets + [f"checkpoint.resume={ckpt}"])
            seconds[tag] += took + took2
            runs[tag] = {
                "records": records,
                "resumed": resumed,
                "ckpt": read_h5(os.path.join(out, "checkpoints", f"step-{STEPS}.h5"),
                                ("params/", "optimizer/")),
                "final": read_h5(os.path.join(out, "final-params.h5"), ("params/",)),
            }
        a, b = runs["new"], runs["base"]
        before = len(problems)
        steps = [r for r in b["records"] if r["type"] == "step"]
        evals = [r for r in b["records"] if r["type"] == "eval"]
        if len(steps) != STEPS or not evals:
            problems.append(f"{name}: the base run logged {len(steps)} steps, {len(evals)} "
                            "evaluations")
        if a["records"] != b["records"]:
            diff = next((x, y) for x, y in zip(a["records"], b["records"]) if x != y) \
                if len(a["records"]) == len(b["records"]) else ("length", len(a["records"]))
            problems.append(f"{name}: metrics records differ, first: {diff}")
        if a["resumed"] != b["resumed"]:
            problems.append(f"{name}: the resumed runs' records differ")
        for what in ("ckpt", "final"):
            x, y = a[what], b[what]
            bad = [k for k in y if k not in x or x[k].tobytes() != y[k].tobytes()]
            if x.keys() != y.keys() or bad:
                problems.append(f"{name}: {what} tensors differ ({len(bad)} of {len(y)}"
                                + (f", first {bad[0]}" if bad else ", names differ") + ")")
        if len(problems) == before:
            done += 1
            print(f"{name}: same bits ({len(steps)} steps, {len(evals)} evaluations, "
                  f"{len(b['ckpt'])} checkpoint tensors, resumed {len(b['resumed'])} records)",
                  flush=True)
        else:
            print("\n".join(problems[before:]), flush=True)
        if len(problems) == before:  # kept for a look when they differ
            for tag in ("base", "new"):
                for suffix in ("", "-resumed"):
                    shutil.rmtree(os.path.join(work, f"{name}-{tag}{suffix}"), ignore_errors=True)
    print(f"seconds: base {seconds['base']:.1f}, new {seconds['new']:.1f}")
    if problems:
        raise SystemExit(f"FAILED: {len(problems)} differences")
    print(f"same bits: {done} layouts identical")


if __name__ == "__main__":
    main()
