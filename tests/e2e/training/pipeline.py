#!/usr/bin/env python3
"""Pipeline parallelism (parallel.pipeline, docs/performance.md "pipeline parallelism")
end to end on the tiny model (4 blocks), the same global batch (micro-batch 2 x 4
micro-batches = 8 sequences) in every layout, 6 steps:

  PP=2, PP=4, PP=2 with blocks [1, 3],
  PP=2 with training.recompute full,
  PP=2 interleaved (2 chunks per rank),
  the same with recompute selective       vs PP=1: bit-identical losses, norms, final-params.h5
  DP=2 x PP=2 interleaved                 vs DP=2: bit-identical
  DP=2 x PP=2 interleaved, ZeRO 1 (mpi)   vs DP=2 x PP=2, ZeRO 0 (mpi): bit-identical
  DP=2 x PP=2 on 4 ranks                  vs DP=2 on 2 ranks: bit-identical;
                                          vs 1 rank: losses 1e-5 relative, parameters 1e-5
                                          relative L2 (data parallelism sums in another order)
  the PP=2 checkpoint at step 3           == PP=1's, tensor by tensor, bit for bit (and the
                                          interleaved run's)
  it resumes on PP=1, PP=4 and PP=2
  interleaved                             == PP=1's steps 4-6 bit for bit
  a hung stage (debug.inject_hang_rank)   ends the job within the deadline (exit 4) naming
                                          the receive, the stage and the peer (interleaved:
                                          and the chunk)
  a NaN gradient on stage 1 (abort)       exit 6 naming the rank, the stage and the tensor
  a replica of stage 1 diverged           the consistency check stops every rank (exit 6)

Why bit-identical: a stage runs exactly the layers of a one-stage run on the same
micro-batches; its gradient accumulates the same micro-batches in the same order (1F1B,
and each chunk of the interleaved schedule, run backwards in micro-batch order); the loss
sums add +0 from the other stages; the gradient norm adds every stage's per-tensor sums
in the whole model's order (which the interleaved chunks are not in). Nothing
changes the order of a floating-point sum, so any difference is a bug (a wrong
activation or gradient sent, a micro-batch run twice or missed, a stage's state lost
in a checkpoint), which moves the losses by far more than rounding.

Elsewhere: ZeRO 2 per stage (pipeline_embedding.py: DP=2 x PP=2 ZeRO 2 == ZeRO 0, the last
stage's copy of the table too); a checkpoint equal to PP=1's resumed on PP=2 1f1b
(pipeline_embedding.py) and on data ranks (zero_stages.py).

usage: pipeline.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

from training_e2e import Comparisons, deck_width, setup

TOL = 1e-5
STEPS, EVERY = 6, 3  # the checkpoint of step EVERY is resumed
SEQ, MICRO, GLOBAL = 32, 2, 8
TIMEOUT_S = 5


def main():
    st = setup(SEQ)
    dstrain, deck, work, data = st.dstrain, st.deck, st.work, st.data
    mpiexec, numproc_flag, preflags = *st.launch, st.preflags
    # Pipeline stages compute what one stage computes; against other layouts each tensor
    # within TOL (and so the whole vector).
    check = Comparisons(TOL, TOL, STEPS)
    problems = check.problems
    same_bits, within = check.same_bits, check.within

    def launch(name, ranks, sets):
        out = os.path.join(work, name)
        cmd = [mpiexec, numproc_flag, str(ranks), "--oversubscribe", *preflags, dstrain, "train",
               deck, "--set", f"data.train={data}/train.txt", "--set", f"data.valid={data}/valid.txt",
               "--set", "data.text_separator=", "--set", f"data.seq_len={SEQ}",
               "--set", f"training.micro_batch_size={MICRO}",
               "--set", f"training.global_batch_size={GLOBAL}",
               "--set", f"training.max_steps={STEPS}", "--set", "training.schedule.warmup_steps=2",
               "--set", "logging.every_steps=1", "--set", "eval.every_steps=0",
               "--set", "eval.batches=1", "--set", f"checkpoint.every_steps={EVERY}",
               "--set", f"run.output_dir={out}"]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        return out, r, time.monotonic() - t0

    def run(name, ranks, sets, layout):
        out, r, _ = launch(name, ranks, sets)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name} exited {r.returncode}")
        if layout not in r.stdout + r.stderr:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name}: the log does not say '{layout}'")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        steps = [(x["step"], x["loss"], x["grad_norm"]) for x in recs if x.get("type") == "step"]
        with h5py.File(os.path.join(out, "final-params.h5"), "r") as f:
            params = {k: np.array(f["params"][k]) for k in f["params"]}
        return out, steps, params

    lay = "data {} x tensor 1 x pipeline {}"
    pp1_out, *pp1 = run("pp1", 1, [], lay.format(1, 1))
    pp2_out, *pp2 = run("pp2", 2, ["parallel.pipeline=2"], lay.format(1, 2))
    same_bits("PP=2 vs PP=1", pp2, pp1)
    _, *pp4 = run("pp4", 4, ["parallel.pipeline=4"], lay.format(1, 4))
    same_bits("PP=4 vs PP=1", pp4, pp1)
    _, *uneven = run("pp2-uneven", 2, ["parallel.pipeline=2", "parallel.pipeline_layers=[1, 3]"],
                     lay.format(1, 2))
    same_bits("PP=2 blocks [1, 3] vs PP=1", uneven, pp1)
    _, *rec = run("pp2-recompute", 2, ["parallel.pipeline=2", "training.recompute=full"],
                  lay.format(1, 2))
    same_bits("PP=2 recompute full vs PP=1 (none)", rec, pp1)
    _, *dp2 = run("dp2", 2, [], lay.format(2, 1))
    _, *dp2pp2 = run("dp2pp2", 4, ["parallel.pipeline=2"], lay.format(2, 2))
    same_bits("DP=2 x PP=2 vs DP=2", dp2pp2, dp2)
    within("DP=2 x PP=2 vs 1 rank", dp2pp2, pp1)
    _, *mpi0 = run("dp2pp2-mpi", 4, ["parallel.pipeline=2", "parallel.backend=mpi"],
                   lay.format(2, 2))
    # ZeRO 2 per stage == ZeRO 0: pipeline_embedding.py (DP=2 x PP=2 with the last stage's
    # copy of the table); ZeRO 1 below (interleaved).

    # The interleaved schedule (2 chunks per rank: rank 0 holds blocks 0 and 2, rank 1
    # blocks 1 and 3; 4 micro-batches, groups of 2): the same bits again.
    inter = ["parallel.pipeline=2", "parallel.pipeline_schedule=interleaved",
             "parallel.virtual_stages=2"]
    inter_out, *pp2v2 = run("pp2v2", 2, inter, lay.format(1, 2))
    same_bits("PP=2 interleaved (V=2) vs PP=1", pp2v2, pp1)
    _, *v2rec = run("pp2v2-recompute", 2, inter + ["training.recompute=selective"],
                    lay.format(1, 2))
    same_bits("PP=2 interleaved, recompute selective vs PP=1", v2rec, pp1)
    _, *v2dp = run("dp2pp2v2", 4, inter, lay.format(2, 2))
    same_bits("DP=2 x PP=2 interleaved vs DP=2", v2dp, dp2)
    _, *v2zero = run("dp2pp2v2-zero1", 4, inter + ["parallel.backend=mpi", "parallel.zero_stage=1"],
                     lay.format(2, 2))
    same_bits("DP=2 x PP=2 interleaved ZeRO 1 vs 1f1b ZeRO 0 (mpi)", v2zero, mpi0)

    # The checkpoints hold the whole model whatever the layout: PP=2's == PP=1's.
    ck = f"checkpoints/step-{EVERY}.h5"
    with h5py.File(os.path.join(pp1_out, ck), "r") as a, \
            h5py.File(os.path.join(pp2_out, ck), "r") as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset)
                     and (n.startswith("params/") or n.startswith("optimizer/")) else None)
        bnames = []
        b.visititems(lambda n, o: bnames.append(n) if isinstance(o, h5py.Dataset)
                     and (n.startswith("params/") or n.startswith("optimizer/")) else None)
        differing = [n for n in names if n not in b or not np.array_equal(a[n][()], b[n][()])]
        if sorted(names) != sorted(bnames) or differing or not names:
            problems.append(f"checkpoint step {EVERY}: PP=2's {len(bnames)} tensors vs PP=1's "
                            f"{len(names)}, {len(differing)} differ")
        else:
            print(f"checkpoint step {EVERY}: PP=2 == PP=1 ({len(names)} tensors, bit for bit)")
        with h5py.File(os.path.join(inter_out, ck), "r") as c:
            differing = [n for n in names if n not in c or not np.array_equal(a[n][()], c[n][()])]
            if differing:
                problems.append(f"checkpoint step {EVERY}: interleaved PP=2's {len(differing)} "
                                f"tensors differ from PP=1's (first {differing[0]})")
            else:
                print(f"checkpoint step {EVERY}: PP=2 interleaved == PP=1 ({len(names)} tensors, "
                      "bit for bit)")

    resume = f"checkpoint.resume={os.path.join(pp2_out, ck)}"
    _, *r1 = run("resume-pp1", 1, [resume], lay.format(1, 1))
    same_bits("PP=2 checkpoint resumed on PP=1 vs PP=1", r1, pp1, first_step=EVERY + 1)
    _, *r4 = run("resume-pp4", 4, [resume, "parallel.pipeline=4"], lay.format(1, 4))
    same_bits("PP=2 checkpoint resumed on PP=4 vs PP=1", r4, pp1, first_step=EVERY + 1)
    _, *rv = run("resume-pp2v2", 2, [resume] + inter, lay.format(1, 2))
    same_bits("PP=2 checkpoint resumed on PP=2 interleaved vs PP=1", rv, pp1,
              first_step=EVERY + 1)
    # The interleaved run's checkpoint is PP=1's bit for bit (above), so resuming it is
    # resuming PP=1's: on PP=2 1f1b, pipeline_embedding.py; on DP=2, zero_stages.py.

    # A hung stage: rank 1 (stage 1) stops after the first checkpoint; stage 0 waits for
    # its activation gradients and ends the job at the deadline, naming what and whom.
    hang = ["debug.inject_hang_rank=1", f"parallel.timeout_s={TIMEOUT_S}"]
    rows = MICRO * SEQ * deck_width(deck)  # a micro-batch's residual stream
    recv = (f"recv (tag {{}}) of {rows} x f32 ({rows * 4} B) from rank 1 on group 'pipeline' "
            f"(2 ranks) did not complete within {TIMEOUT_S} s")
    check.hung("hang", launch("hang", 2, ["parallel.pipeline=2"] + hang),
               ["pipeline stage 0 waiting for the activation gradients of micro-batch 1 from "
                "stage 1 (world rank 1)", recv.format(1)],
               f"stage 1 hung (deadline {TIMEOUT_S} s), named with the receive and the peer")
    # Interleaved: stage 0's warm-up needs its second chunk's input from stage 1 (the
    # output of stage 1's first chunk), and names the chunk.
    check.hung("hang (interleaved)", launch("hang-v2", 2, inter + hang),
               ["pipeline stage 0 waiting for the activations of micro-batch 1 (chunk 1) from "
                "stage 1 (world rank 1)", recv.format(2)],
               "stage 1 hung, named with the receive, the chunk and the peer")

    # A NaN in the last rank's gradient (stage 1 of DP=2 x PP=2): every rank stops alike,
    # naming the rank, its stage and the tensor.
    _, r, _ = launch("nan", 4, ["parallel.pipeline=2", "debug.inject_nan_step=2"])
    want = ("non-finite gradients at step 2: first on rank 3 (pipeline stage 1), tensor "
            "model.layers.3.mlp.down_proj.weight[0] (debug.nan_policy: abort)")
    if r.returncode != 6 or want not in r.stdout + r.stderr:
        print(r.stdout + r.stderr)
        problems.append(f"nan: exit {r.returncode} (want 6), or the log does not say '{want}'")
    else:
        print("nan: the non-finite gradient named with its rank, stage and tensor")

    # A parameter perturbed on rank 3 (stage 1, data rank 1) after step 0: the consistency
    # check of step 1 compares each stage's replicas and stops every rank alike (exit 6),
    # naming the tensor of the whole model and the world ranks.
    _, r, _ = launch("diverged", 4, ["parallel.pipeline=2", "debug.inject_divergence_rank=3",
                                     "debug.consistency_every=1", "parallel.timeout_s=60"])
    want = ("parameters differ between ranks at step 1: first tensor "
            "model.layers.2.input_layernorm.weight differs from rank 2's on rank 3")
    if r.returncode != 6 or want not in r.stdout + r.stderr:
        print(r.stdout + r.stderr)
        problems.append(f"diverged: exit {r.returncode} (want 6), or the log does not say '{want}'")
    else:
        print("diverged: the consistency check stopped every stage, naming the tensor and ranks")

    print("losses PP=1: " + " ".join(f"{s[1]:.6f}" for s in pp1[0]))
    if problems:
        print("\n".join(problems))
        print("FAILED: pipeline parallelism does not give the one-stage run")
        return 1
    print("pipeline: PP=2 == PP=4 == PP=2 interleaved == PP=1 bit for bit; DP=2 x PP=2 == DP=2; "
          "checkpoints resume across layouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
