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
import dataclasses
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training_e2e import read_h5, setup  # noqa: E402

STEPS, RESUME_AT = 12, 6
SEQ, MICRO, GLOBAL = 32, 2, 8
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


# Beyond training_e2e.Setup.train's settings (later --set values win): evaluations, two
# checkpoints kept, the consistency check and small buckets exercised.
COMMON = ["eval.every_steps=4", "eval.batches=2", "checkpoint.keep_last=2",
          "debug.consistency_every=3", "parallel.bucket_mb=1"]


def train(launcher, name, ranks, sets):
    """A run of `launcher`'s binary (a training_e2e.Setup) that must exit 0: its folder and
    its step and eval records' results."""
    out, r, took = launcher.train(name, ranks, COMMON + sets, seq=SEQ, micro=MICRO,
                               global_batch=GLOBAL, steps=STEPS, checkpoint_every=RESUME_AT)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAILED: {name} exited {r.returncode}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [results(json.loads(x)) for x in f if x.strip()]
    return out, [x for x in records if x.get("type") in ("step", "eval")], took


def main():
    # BASE NEW DECK GENERATOR WORK ...: training_e2e.setup() parses the rest as NEW's run
    # (the work folder emptied, the synthetic corpus written), BASE runs the same.
    base, *args = sys.argv[1:]
    # Both binaries measure their peak (BASE may predate logging.peak_gflops).
    new_setup = dataclasses.replace(setup(SEQ, [sys.argv[0], *args]), peak_gflops=None)
    setups = {"base": dataclasses.replace(new_setup, dstrain=base), "new": new_setup}
    only = None
    if new_setup.extra[:1] == ["--only"]:
        only = set(new_setup.extra[1].split(","))
        unknown = only - set(LAYOUTS)
        if unknown:
            raise SystemExit(f"same_bits: unknown layouts {sorted(unknown)}; known: "
                             f"{', '.join(LAYOUTS)}")
    work = new_setup.work
    problems = []
    done = 0
    seconds = {"base": 0.0, "new": 0.0}
    for name, (ranks, sets) in LAYOUTS.items():
        if only and name not in only:
            continue
        runs = {}
        for tag, launcher in setups.items():
            out, records, took = train(launcher, f"{name}-{tag}", ranks, sets)
            ckpt = os.path.join(out, "checkpoints", f"step-{RESUME_AT}.h5")
            _, resumed, took2 = train(launcher, f"{name}-{tag}-resumed", ranks,
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
