#!/usr/bin/env python3
"""ZeRO (parallel.zero_stage, docs/performance.md "ZeRO") end to end with the tiny deck.

1. Stages 0, 1 and 2 on the same ranks give the same run bit for bit: every step's loss
   and gradient norm (metrics.jsonl), every tensor of final-params.h5, and every
   parameter and AdamW moment of the last checkpoint (which stays logical: the moments of
   the shards are written whole). At 2 and 4 ranks over MPI (Open MPI's non-blocking
   reduce-scatter sums in the order of its all-reduce) and 2 ranks over shm (the shared
   sums are those of stage 0). The strategies themselves, at 1, 2 and 4 ranks over both
   (one rank: ZeRO does nothing) and with the bf16 master shard, are compared bit for bit
   with a one-rank reference by grad_sync_mpi_tests; this script runs them in the trainer.
2. Memory: at 4 ranks over MPI without accumulation, each stage's peak resident memory
   per rank (peak_mem_bytes, before the first checkpoint) is lower than the previous stage's by at least half of what
   it no longer holds: 8 bytes x 3/4 of the parameters (the moments outside the shard)
   for stage 1, 4 bytes x 3/4 (the gradients outside it) for stage 2.
4. bf16 and fp16 (the fp32 master sharded at stage >= 1: each rank holds its shard of
   the master, the ranks gather the rounded compute copy): stages 0, 1 and 2 give the
   same run bit for bit (as 1.), bf16 at 4 ranks over MPI and 2 over shm, fp16 at 2 ranks
   over MPI with a loss-scaler overflow (a skipped step) injected; at 4 ranks over MPI stage 1's peak is
   lower than stage 0's by at least half of 12 bytes x 3/4 of the parameters (moments
   and master outside the shard); the 4-rank stage-2 bf16 checkpoint (master gathered
   whole) resumes at 4 ranks stage 0 bit for bit, and at 2 ranks stage 1 == stage 0.
3. A checkpoint moves between stages and world sizes: saved at step 3 by the 4-rank
   stage-2 run, resumed at 4 ranks stage 0 it continues bit for bit as the stage-2 run
   did; resumed at 2 ranks stage 1 and stage 0 the two agree bit for bit; resumed at 1
   rank stage 0 and at 2 ranks they stay within 1e-5 of the 4-rank run (the summation
   order of another world size, as tests/e2e/training/rank_invariance.py: the checkpoint
   itself holds the same logical tensors whatever wrote it, so resharding adds nothing).

usage: zero_stages.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import json
import os
import subprocess
import sys

import numpy as np

from training_e2e import read_h5, same_bits, setup

STEPS, EVERY = 6, 3
SEQ, MICRO, GLOBAL = 64, 2, 8
TOL = 1e-5


def main():
    st = setup(SEQ)
    dstrain, deck, work, data = st.dstrain, st.deck, st.work, st.data
    mpiexec, numproc_flag, preflags = *st.launch, st.preflags
    problems = []

    def run(name, ranks, backend, zero, extra=(), precision="fp32"):
        out = os.path.join(work, name)
        cmd = [mpiexec, numproc_flag, str(ranks), "--oversubscribe", *preflags, dstrain, "train",
               deck, "--set", f"data.train={data}/train.txt", "--set", f"data.valid={data}/valid.txt",
               "--set", "data.text_separator=", "--set", f"data.seq_len={SEQ}",
               "--set", f"training.micro_batch_size={MICRO}",
               "--set", f"training.global_batch_size={GLOBAL}",
               "--set", f"training.max_steps={STEPS}", "--set", "training.schedule.warmup_steps=2",
               "--set", "logging.every_steps=1", "--set", "eval.every_steps=0",
               "--set", f"checkpoint.every_steps={EVERY}", "--set", f"run.output_dir={out}",
               "--set", f"parallel.backend={backend}", "--set", f"parallel.zero_stage={zero}",
               "--set", "parallel.bucket_mb=1", "--set", f"training.precision={precision}",
               *extra]
        r = subprocess.run(cmd, capture_output=True, text=True)
        log = r.stdout + r.stderr
        if r.returncode != 0:
            print(log)
            raise SystemExit(f"FAILED: {name} exited {r.returncode}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(x) for x in f if x.strip()]
        steps = [s for s in steps if s.get("type") == "step"]
        return {
            "log": log,
            "fields": [(s["step"], s["loss"], s["grad_norm"]) for s in steps],
            # Before the first checkpoint, which gathers the moments whole for a while
            # (docs/performance.md, "ZeRO"): the high-water mark keeps that.
            "peak": max((s["peak_mem_bytes"] for s in steps if s["step"] <= EVERY), default=0),
            "final": read_h5(os.path.join(out, "final-params.h5"), ("params/",)),
            "ckpt": read_h5(os.path.join(out, "checkpoints", f"step-{STEPS}.h5"),
                            ("params/", "optimizer/")),
            "out": out,
        }

    # 1. the stages against each other
    runs = {}
    for ranks, backend in [(2, "mpi"), (2, "shm"), (4, "mpi")]:
        for zero in (0, 1, 2):
            runs[(ranks, backend, zero)] = run(f"np{ranks}-{backend}-zero{zero}", ranks, backend,
                                               zero)
        base = runs[(ranks, backend, 0)]
        for zero in (1, 2):
            r = runs[(ranks, backend, zero)]
            name = f"np={ranks} {backend} zero {zero} vs zero 0"
            if r["fields"] != base["fields"]:
                problems.append(f"{name}: step losses or norms differ: {r['fields']} vs "
                                f"{base['fields']}")
            if not same_bits(r["final"], base["final"]):
                problems.append(f"{name}: final-params.h5 differs")
            if not same_bits(r["ckpt"], base["ckpt"]):
                problems.append(f"{name}: the step-{STEPS} checkpoint's tensors differ")
        print(f"np={ranks} {backend}: zero 0/1/2 give bit-identical losses, norms, "
              f"{len(base['final'])} final tensors, {len(base['ckpt'])} checkpoint tensors; "
              "peak MB " + "/".join(f"{runs[(ranks, backend, z)]['peak'] / 1e6:.1f}"
                                    for z in (0, 1, 2)))

    # 2. memory at 4 ranks over MPI, no accumulation
    n_params = sum(t.size for t in runs[(4, "mpi", 0)]["final"].values())
    peaks = [runs[(4, "mpi", z)]["peak"] for z in (0, 1, 2)]
    for z, saved in ((1, 8 * n_params * 3 // 4), (2, 4 * n_params * 3 // 4)):
        if peaks[z - 1] - peaks[z] < saved // 2:
            problems.append(f"np=4 mpi: zero {z} peak {peaks[z]} is not at least {saved // 2} "
                            f"below zero {z - 1}'s {peaks[z - 1]}")

    # 3. resuming the 4-rank stage-2 checkpoint of step 3
    source = os.path.join(runs[(4, "mpi", 2)]["out"], "checkpoints", f"step-{EVERY}.h5")
    resume = ("--set", f"checkpoint.resume={source}")
    a = runs[(4, "mpi", 2)]
    r4 = run("resume-np4-zero0", 4, "mpi", 0, resume)
    if r4["fields"] != a["fields"][EVERY:] or not same_bits(r4["final"], a["final"]):
        problems.append("resumed at np=4 zero 0: steps 4-6 or final parameters differ from the "
                        "stage-2 run's")
    r2z1 = run("resume-np2-zero1", 2, "mpi", 1, resume)
    r2z0 = run("resume-np2-zero0", 2, "mpi", 0, resume)
    if r2z1["fields"] != r2z0["fields"] or not same_bits(r2z1["final"], r2z0["final"]):
        problems.append("resumed at np=2: zero 1 and zero 0 differ")
    r1 = run("resume-np1-zero0", 1, "mpi", 0, resume)
    for name, r in (("np=1 zero 0", r1), ("np=2 zero 1", r2z1)):
        if [s for s, _, _ in r["fields"]] != list(range(EVERY + 1, STEPS + 1)):
            problems.append(f"resumed at {name}: logged steps {r['fields']}")
            continue
        worst = max(abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(r["fields"], a["fields"][EVERY:]))
        worst_p = max(np.linalg.norm(r["final"][k].astype(np.float64) - a["final"][k]) /
                      max(np.linalg.norm(a["final"][k].astype(np.float64)), 1e-30)
                      for k in a["final"])
        print(f"resumed at {name} from the np=4 zero 2 checkpoint: losses within {worst:.1e}, "
              f"parameters within {worst_p:.1e} (relative) of the np=4 run")
        if worst > TOL or worst_p > TOL:
            problems.append(f"resumed at {name}: {worst:.2e} / {worst_p:.2e} > {TOL}")
    # 4. bf16 and fp16: the master sharded
    for precision, configs, extra in (
            ("bf16", [(2, "shm"), (4, "mpi")], ()),
            ("fp16", [(2, "mpi")], ("--set", "debug.inject_overflow_step=1"))):
        for ranks, backend in configs:
            got = {z: run(f"{precision}-np{ranks}-{backend}-zero{z}", ranks, backend, z, extra,
                          precision) for z in (0, 1, 2)}
            for zero in (1, 2):
                r, base = got[zero], got[0]
                name = f"{precision} np={ranks} {backend} zero {zero} vs zero 0"
                if r["fields"] != base["fields"]:
                    problems.append(f"{name}: step losses or norms differ: {r['fields']} vs "
                                    f"{base['fields']}")
                if not same_bits(r["final"], base["final"]):
                    problems.append(f"{name}: final-params.h5 differs")
                if not same_bits(r["ckpt"], base["ckpt"]):
                    problems.append(f"{name}: the step-{STEPS} checkpoint's tensors differ")
            if precision == "fp16" and "step skipped" not in got[2]["log"]:
                problems.append(f"fp16 np={ranks}: the injected overflow skipped no step")
            print(f"{precision} np={ranks} {backend}: zero 0/1/2 bit-identical; peak MB " +
                  "/".join(f"{got[z]['peak'] / 1e6:.1f}" for z in (0, 1, 2)))
            if precision == "bf16" and ranks == 4:
                saved = 12 * n_params * 3 // 4
                if got[0]["peak"] - got[1]["peak"] < saved // 2:
                    problems.append(f"bf16 np=4 mpi: zero 1 peak {got[1]['peak']} is not at least "
                                    f"{saved // 2} below zero 0's {got[0]['peak']}")
                source = os.path.join(got[2]["out"], "checkpoints", f"step-{EVERY}.h5")
                resume = ("--set", f"checkpoint.resume={source}")
                b4 = run("bf16-resume-np4-zero0", 4, "mpi", 0, resume, "bf16")
                if b4["fields"] != got[2]["fields"][EVERY:] or not same_bits(b4["final"],
                                                                             got[2]["final"]):
                    problems.append("bf16 resumed at np=4 zero 0: steps 4-6 or final parameters "
                                    "differ from the stage-2 run's")
                b2z1 = run("bf16-resume-np2-zero1", 2, "mpi", 1, resume, "bf16")
                b2z0 = run("bf16-resume-np2-zero0", 2, "mpi", 0, resume, "bf16")
                if b2z1["fields"] != b2z0["fields"] or not same_bits(b2z1["final"], b2z0["final"]):
                    problems.append("bf16 resumed at np=2: zero 1 and zero 0 differ")
    if problems:
        print("\n".join(problems))
        print("FAILED: the ZeRO stages do not give the same run")
        return 1
    print("zero stages: 0 == 1 == 2 bit for bit at np=2/4 (mpi), np=2 (shm); the np=4 zero 2 "
          "checkpoint resumes at np=4 zero 0 bit for bit, at np=2 zero 1 == zero 0, at np=1 "
          f"and np=2 within {TOL:g}; peak MB per rank at np=4 " +
          "/".join(f"{p / 1e6:.1f}" for p in peaks) + "; bf16/fp16 likewise with the master "
          "sharded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
