#!/usr/bin/env python3
"""Sequence parallelism (parallel.sequence_parallel, docs/performance.md "sequence
parallelism") end to end on the tiny model (4 blocks, 4 heads, ffn 688, vocab 260), the
same global batch (micro-batch 2 x 4 micro-batches = 8 sequences of 64 tokens) in every
layout, 10 steps:

  TP=2 + SP                                   vs TP=2: the first step's loss bit for bit
                                              (every sum of the forward is the same two
                                              partial sums added); the tensor group's
                                              traffic as counted (metrics.jsonl)
  TP=2 + SP, TP=4 + SP, TP=2 + SP tied        vs 1 rank: losses within 1e-5 relative, the
  DP=2 x TP=2 x PP=2 + SP on 8 ranks          final parameters (one vector of whole tensors)
  n_kv_heads 2 on TP=4 + SP                   within 1e-5 relative L2, each tensor within
                                              5e-5
  TP=2 + SP, training.recompute full          vs TP=2 + SP: bit-identical
  TP=2 + SP, training.recompute selective     vs TP=2 + SP: bit-identical
  TP=2 + SP x PP=2 interleaved (2 chunks)     vs TP=2 + SP: bit-identical
  DP=2 x TP=2 + SP, ZeRO 2 (mpi)              vs DP=2 x TP=2 + SP (mpi): bit-identical
  the TP=2 + SP checkpoint at step 5          resumes on 1 rank and on TP=4 + SP: steps
                                              6-10 within the bounds of TP=2 + SP's

Why bounds and not bits against one rank: as for tensor parallelism (tensor_parallel.py),
row-parallel products and the vocabulary-parallel cross-entropy sum in T partial sums; and
under sequence parallelism each norm weight's gradient is the sum of T ranks' partial sums
over their token rows. A real error moves the parameters by far more: without the sum of
the norm weights' gradients over the group, TP=2 + SP's parameters are 2.3e-3 from one
rank's after 10 steps (its losses 2.7e-6: the parameters are the sharper check).

usage: sequence_parallel.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import os
import sys

from training_e2e import Comparisons, read_run, setup

TOL = 1e-5         # losses (relative), the whole parameter vector (relative L2)
TENSOR_TOL = 5e-5  # each tensor (relative L2): tensor_parallel.py says why
STEPS = 10
SEQ, MICRO, GLOBAL = 64, 2, 8
WIDTH, BLOCKS = 256, 4  # the tiny model's d_model and blocks
SP = ["parallel.sequence_parallel=true"]


def main():
    st = setup(SEQ)
    check = Comparisons(TOL, TENSOR_TOL, STEPS)
    problems = check.problems
    same_bits, within = check.same_bits, check.within

    def run(name, ranks, sets, layout):
        out, r, _ = st.train(name, ranks, sets, seq=SEQ, micro=MICRO, global_batch=GLOBAL,
                             steps=STEPS, checkpoint_every=5)
        text = r.stdout + r.stderr
        if r.returncode != 0:
            print(text)
            raise SystemExit(f"FAILED: {name} exited {r.returncode}")
        if layout not in text:
            print(text)
            raise SystemExit(f"FAILED: {name}: the log does not say '{layout}'")
        recs, params = read_run(out)
        steps = [(x["step"], x["loss"], x["grad_norm"]) for x in recs if x.get("type") == "step"]
        return out, steps, params, recs

    lay = "data {} x tensor {} x pipeline {}"
    _, *one = run("tp1", 1, [], lay.format(1, 1, 1))
    _, *tp2 = run("tp2", 2, ["parallel.tensor=2"], lay.format(1, 2, 1))
    sp2_out, *sp2 = run("sp2", 2, ["parallel.tensor=2"] + SP, lay.format(1, 2, 1))
    if sp2[0][0][:2] != tp2[0][0][:2]:
        problems.append(f"TP=2 + SP: the first step's loss {sp2[0][0][1]!r} is not TP=2's "
                        f"{tp2[0][0][1]!r}")
    else:
        print(f"TP=2 + SP: the first step's loss is TP=2's bit for bit ({sp2[0][0][1]!r})")
    within("TP=2 + SP vs 1 rank", sp2, one)
    # The traffic, in all-reduce equivalents of the residual stream (MICRO x SEQ x WIDTH
    # fp32; a reduce-scatter or an all-gather counts half): per block 2 in forward (two
    # gathers, two scatters) and 3 in backward (four gathers: the output gradient and the
    # re-gathered norm twice; two scatters); 2 at the ends (the embedding's reduce-scatter
    # and its gradient's gather, the head's gather of its norm's rows and the reduce-scatter
    # of their gradient); a norm weight's gradient of WIDTH fp32 per norm (two per block and
    # the final one); the cross-entropy's 20 bytes a token.
    whole = MICRO * SEQ * WIDTH * 4
    want = (GLOBAL // MICRO) * ((5 * BLOCKS + 2) * whole + (2 * BLOCKS + 1) * WIDTH * 4 +
                                MICRO * SEQ * 20)
    rec = [x for x in sp2[2] if x.get("type") == "step"][-1]
    if rec.get("tensor_allreduce_bytes") != want:
        problems.append(f"TP=2 + SP: metrics.jsonl says tensor_allreduce_bytes "
                        f"{rec.get('tensor_allreduce_bytes')}, expected {want}")
    else:
        print(f"TP=2 + SP: {want} bytes (all-reduce equivalents) over the tensor group per step")

    _, *sp4 = run("sp4", 4, ["parallel.tensor=4"] + SP, lay.format(1, 4, 1))
    within("TP=4 + SP vs 1 rank", sp4, one)
    _, *tied1 = run("tied1", 1, ["model.tie_embeddings=true"], lay.format(1, 1, 1))
    _, *tied2 = run("tied-sp2", 2, ["model.tie_embeddings=true", "parallel.tensor=2"] + SP,
                    lay.format(1, 2, 1))
    within("TP=2 + SP vs 1 rank, tied embeddings", tied2, tied1)
    _, *three = run("dp2tp2pp2-sp", 8, ["parallel.tensor=2", "parallel.pipeline=2"] + SP,
                    lay.format(2, 2, 2))
    within("DP=2 x TP=2 x PP=2 + SP (8 ranks) vs 1 rank", three, one)
    _, *inter = run("tp2pp2v2-sp", 4, ["parallel.tensor=2", "parallel.pipeline=2",
                                        "parallel.pipeline_schedule=interleaved",
                                        "parallel.virtual_stages=2"] + SP, lay.format(1, 2, 2))
    same_bits("TP=2 + SP x PP=2 interleaved (4 ranks) vs TP=2 + SP", inter, sp2)
    kv2 = ["model.n_kv_heads=2"]
    _, *kv1r = run("kv2-tp1", 1, kv2, lay.format(1, 1, 1))
    _, *kv4 = run("kv2-sp4", 4, kv2 + ["parallel.tensor=4"] + SP, lay.format(1, 4, 1))
    within("n_kv_heads 2, TP=4 + SP vs 1 rank", kv4, kv1r)

    _, *full = run("sp2-full", 2, ["parallel.tensor=2", "training.recompute=full"] + SP,
                   lay.format(1, 2, 1))
    same_bits("TP=2 + SP recompute full vs TP=2 + SP", full, sp2)
    _, *sel = run("sp2-selective", 2, ["parallel.tensor=2", "training.recompute=selective"] + SP,
                  lay.format(1, 2, 1))
    same_bits("TP=2 + SP recompute selective vs TP=2 + SP", sel, sp2)
    mpi = ["parallel.tensor=2", "parallel.backend=mpi"] + SP
    _, *dp = run("dp2tp2-sp", 4, mpi, lay.format(2, 2, 1))
    within("DP=2 x TP=2 + SP vs 1 rank", dp, one)
    _, *z2 = run("dp2tp2-sp-zero2", 4, mpi + ["parallel.zero_stage=2"], lay.format(2, 2, 1))
    same_bits("DP=2 x TP=2 + SP ZeRO 2 vs ZeRO 0 (mpi)", z2, dp)

    # The checkpoint holds whole tensors: TP=2 + SP's resumes without the split and at
    # another tensor group.
    ck = os.path.join(sp2_out, "checkpoints/step-5.h5")
    _, *r1 = run("resume-1", 1, [f"checkpoint.resume={ck}"], lay.format(1, 1, 1))
    within("TP=2 + SP checkpoint resumed on 1 rank vs TP=2 + SP", r1, sp2, first_step=6)
    _, *r4 = run("resume-sp4", 4, [f"checkpoint.resume={ck}", "parallel.tensor=4"] + SP,
                 lay.format(1, 4, 1))
    within("TP=2 + SP checkpoint resumed on TP=4 + SP vs TP=2 + SP", r4, sp2, first_step=6)

    print("losses 1 rank:   " + " ".join(f"{s[1]:.6f}" for s in one[0]))
    print("losses TP=2 + SP: " + " ".join(f"{s[1]:.6f}" for s in sp2[0]))
    if problems:
        print("\n".join(problems))
        print("FAILED: sequence parallelism does not train as one rank does")
        return 1
    print("sequence parallelism: TP with SP trains as one rank in every layout; recompute and "
          "ZeRO give its bits; checkpoints resume across layouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
