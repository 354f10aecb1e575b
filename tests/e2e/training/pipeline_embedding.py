#!/usr/bin/env python3
"""Pipeline stages with tied embeddings or the MTP module (model/stage.hpp: the last stage
holds a copy of the embedding table, its gradient summed with stage 0's after each step's
backwards) end to end on the tiny model (4 blocks), the same global batch (micro-batch 2 x
4 micro-batches = 8 sequences) in every layout, 6 steps:

tied embeddings (model.tie_embeddings):
  PP=2                                   vs PP=1: the first loss bit for bit; losses within
                                         1e-5 relative, parameters 1e-5 relative L2 (below)
  PP=4, PP=2 interleaved (2 chunks)      vs PP=2: bit-identical
  DP=2 x PP=2 on 4 ranks (mpi)           vs DP=2 on 2 ranks: within the bounds
  DP=2 x PP=2, ZeRO 2 (mpi)              vs DP=2 x PP=2, ZeRO 0 (mpi): bit-identical
  TP=2 x PP=2 on 4 ranks                 vs PP=1: within the bounds, each tensor within
                                         5e-5 (tensor_parallel.py's bound and reason)
  the PP=2 checkpoint at step 3          holds PP=1's tensors (the table once)
  it resumes on PP=2                     == PP=2's steps 4-6 bit for bit (both copies
                                         filled from the one table)
  it resumes on PP=1; PP=1's on PP=2     within the bounds of the run it continues
  the last stage's copy perturbed        the consistency check stops every rank (exit 6)
                                         naming both ends' ranks
the MTP module (model.mtp_depth 1):
  PP=2                                   vs PP=1: first losses (main and MTP) bit for bit,
                                         both losses within 1e-5, parameters 1e-5
  PP=2 interleaved                       vs PP=2: bit-identical
  tiny-moe (MoE blocks, the MTP module's vs PP=1: within the bounds, the MTP block's loads
  block MoE too), PP=2                   in the metrics (4 MoE blocks), step 1's bit for bit

Why not bit for bit against PP=1: the table's gradient has two contributions, the
embedding's (stage 0) and the head's or the MTP module's (the last stage). One stage adds
both into one buffer micro-batch by micro-batch; stages add each end's over the
micro-batches, then the two. Floating-point addition is not associative, so the sums
differ in their last bits (about 1e-7 relative), and 10 AdamW steps carry that to about
1e-6 in the parameters; 1e-5 leaves a margin while a lost contribution (the copy never
summed, a micro-batch missed) moves the losses by 1e-3 or more. Between stage layouts
each end's sum is the same, so PP=2 == PP=4 == interleaved bit for bit.

usage: pipeline_embedding.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import os
import sys

import h5py

from training_e2e import Comparisons, setup

TOL = 1e-5
# Each tensor of a tensor-parallel run (relative L2): tensor_parallel.py's bound and reason.
# The residual-scaled o_proj moves most: 2.7e-5 under TP=2 x PP=2 on an AMD EPYC host, while
# the whole vector stays within 2.6e-6 (1e-5 per tensor held on the host where this test
# was written, and failed on that one: the class of rounding, not of a bug).
TP_TENSOR_TOL = 5e-5
STEPS, EVERY = 6, 3  # the checkpoint of step EVERY is resumed
SEQ, MICRO, GLOBAL = 32, 2, 8


def main():
    st = setup(SEQ)
    check = Comparisons(TOL, TOL, STEPS)
    problems = check.problems

    def launch(name, ranks, sets, steps=STEPS):
        return st.train(name, ranks, sets, seq=SEQ, micro=MICRO, global_batch=GLOBAL,
                        steps=steps, checkpoint_every=EVERY)

    def run(name, ranks, sets, layout):
        out, recs, params = st.run(name, ranks, sets, layout, seq=SEQ, micro=MICRO,
                                   global_batch=GLOBAL, steps=STEPS, checkpoint_every=EVERY)
        return out, [(x["step"], x["loss"], x["grad_norm"]) for x in recs], params, recs

    def first_step_same(name, a, b):
        """Step 1's losses (main, MTP) equal bit for bit: the same forward from the same
        initial parameters (only the gradients' sums differ)."""
        got = (a[2][0]["loss"], a[2][0].get("mtp_loss"))
        want = (b[2][0]["loss"], b[2][0].get("mtp_loss"))
        if got != want:
            problems.append(f"{name}: step 1 losses {got} vs {want}")
        else:
            print(f"{name}: step 1 losses bit for bit")

    lay = "data {} x tensor {} x pipeline {}"
    # --- tied embeddings
    tied = ["model.tie_embeddings=true"]
    pp1_out, *pp1 = run("tied-pp1", 1, tied, lay.format(1, 1, 1))
    pp2_out, *pp2 = run("tied-pp2", 2, tied + ["parallel.pipeline=2"], lay.format(1, 1, 2))
    first_step_same("tied PP=2 vs PP=1", pp2, pp1)
    check.within("tied PP=2 vs PP=1", pp2, pp1)
    _, *pp4 = run("tied-pp4", 4, tied + ["parallel.pipeline=4"], lay.format(1, 1, 4))
    check.same_bits("tied PP=4 vs PP=2", pp4, pp2)
    inter = ["parallel.pipeline=2", "parallel.pipeline_schedule=interleaved",
             "parallel.virtual_stages=2"]
    _, *v2 = run("tied-pp2v2", 2, tied + inter, lay.format(1, 1, 2))
    check.same_bits("tied PP=2 interleaved vs PP=2", v2, pp2)
    _, *dp2 = run("tied-dp2", 2, tied, lay.format(2, 1, 1))
    # DP=2 x PP=2 over MPI (the ZeRO runs' reference; the shared-memory sum under stages:
    # pipeline.py's DP=2 x PP=2, DP=2's bits).
    mpi = tied + ["parallel.pipeline=2", "parallel.backend=mpi"]
    _, *z0 = run("tied-dp2pp2-mpi", 4, mpi, lay.format(2, 1, 2))
    check.within("tied DP=2 x PP=2 vs DP=2", z0, dp2)
    # ZeRO 2 (the gradients sharded too): the copy's sum with stage 0's comes before the
    # reduce-scatter and the gathered table fills both copies. ZeRO 1 under stages:
    # pipeline.py (interleaved) and pipeline_moe.py.
    _, *z2 = run("tied-dp2pp2-zero2", 4, mpi + ["parallel.zero_stage=2"], lay.format(2, 1, 2))
    check.same_bits("tied DP=2 x PP=2 ZeRO 2 vs ZeRO 0 (mpi)", z2, z0)
    _, *tp2pp2 = run("tied-tp2pp2", 4, tied + ["parallel.pipeline=2", "parallel.tensor=2"],
                     lay.format(1, 2, 2))
    check.within("tied TP=2 x PP=2 vs PP=1", tp2pp2, pp1, tensor_tol=TP_TENSOR_TOL)

    # The checkpoint holds the whole model: the table once, as PP=1's.
    ck = f"checkpoints/step-{EVERY}.h5"

    def names(path):
        out = []
        with h5py.File(path, "r") as f:
            f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset)
                         and n.startswith(("params/", "optimizer/")) else None)
        return sorted(out)

    n1, n2 = names(os.path.join(pp1_out, ck)), names(os.path.join(pp2_out, ck))
    if n1 != n2 or "params/model.embed_tokens.weight" not in n2 or "params/lm_head.weight" in n2:
        problems.append(f"tied checkpoint: PP=2's {len(n2)} tensors vs PP=1's {len(n1)}")
    else:
        print(f"tied checkpoint step {EVERY}: PP=2 holds PP=1's {len(n2)} tensors (the table once)")
    # Both copies filled from the one table: the resumed run is the run's own bit for bit
    # (a copy left at its initial values would change every loss).
    _, *r2 = run("tied-resume-pp2", 2, tied + ["parallel.pipeline=2",
                                               f"checkpoint.resume={os.path.join(pp2_out, ck)}"],
                 lay.format(1, 1, 2))
    check.same_bits("tied PP=2 checkpoint resumed on PP=2 vs PP=2", r2, pp2, first_step=EVERY + 1)
    _, *r1 = run("tied-resume-pp1", 1, tied + [f"checkpoint.resume={os.path.join(pp2_out, ck)}"],
                 lay.format(1, 1, 1))
    check.within("tied PP=2 checkpoint resumed on PP=1 vs PP=2", r1, pp2, first_step=EVERY + 1)
    _, *r12 = run("tied-resume-pp1-on-pp2", 2,
                  tied + ["parallel.pipeline=2", f"checkpoint.resume={os.path.join(pp1_out, ck)}"],
                  lay.format(1, 1, 2))
    check.within("tied PP=1 checkpoint resumed on PP=2 vs PP=1", r12, pp1, first_step=EVERY + 1)

    # The last stage's copy perturbed (rank 1 of PP=2; the first parameter of
    # its store is the copy): the consistency check after step 1 names both ends.
    _, r, _ = launch("tied-diverged", 2, tied + ["parallel.pipeline=2",
                                                 "debug.inject_divergence_rank=1",
                                                 "debug.consistency_every=1"], steps=4)
    want = ("parameters differ between ranks at step 1: the copy of model.embed_tokens.weight "
            "on rank 1 (pipeline stage 1, read by the tied head) differs from the table on "
            "rank 0 (stage 0)")
    if r.returncode != 6 or want not in r.stdout + r.stderr:
        print(r.stdout + r.stderr)
        problems.append(f"a diverged copy: exit {r.returncode} (want 6), or the log does not "
                        f"say '{want}'")
    else:
        print("a diverged copy of the table: the consistency check names both ends (exit 6)")

    # --- the MTP module
    mtp = ["model.mtp_depth=1"]
    _, *m1 = run("mtp-pp1", 1, mtp, lay.format(1, 1, 1))
    _, *m2 = run("mtp-pp2", 2, mtp + ["parallel.pipeline=2"], lay.format(1, 1, 2))
    first_step_same("MTP PP=2 vs PP=1", m2, m1)
    check.within("MTP PP=2 vs PP=1", m2, m1)

    def mtp_within(name, a, b):
        check.key_within(name, a[2], b[2], "mtp_loss")

    mtp_within("MTP PP=2 vs PP=1", m2, m1)
    _, *mv2 = run("mtp-pp2v2", 2, mtp + inter, lay.format(1, 1, 2))
    check.same_bits("MTP PP=2 interleaved vs PP=2", mv2, m2)
    if [x["mtp_loss"] for x in mv2[2]] != [x["mtp_loss"] for x in m2[2]]:
        problems.append("MTP PP=2 interleaved vs PP=2: the MTP losses differ")
    moe = ["model.preset=tiny-moe", "model.moe.bias_update_rate=0.01"] + mtp
    _, *e1 = run("mtp-moe-pp1", 1, moe, lay.format(1, 1, 1))
    _, *e2 = run("mtp-moe-pp2", 2, moe + ["parallel.pipeline=2"], lay.format(1, 1, 2))
    first_step_same("MTP tiny-moe PP=2 vs PP=1", e2, e1)
    check.within("MTP tiny-moe PP=2 vs PP=1", e2, e1)
    mtp_within("MTP tiny-moe PP=2 vs PP=1", e2, e1)
    # 3 MoE blocks and the MTP module's, each with its loads and bias, in the model's order.
    if len(e2[2][0]["moe"]) != 4 or e2[2][0]["moe"] != e1[2][0]["moe"]:
        problems.append(f"MTP tiny-moe PP=2: step 1's MoE blocks {e2[2][0]['moe']} vs "
                        f"{e1[2][0]['moe']} (want 4, equal)")
    else:
        print("MTP tiny-moe PP=2: step 1's loads and biases of the 4 MoE blocks (the MTP "
              "module's last) bit for bit")

    print("losses tied PP=1: " + " ".join(f"{s[1]:.6f}" for s in pp1[0]))
    print("losses MTP PP=1:  " + " ".join(f"{x['loss']:.6f}/{x['mtp_loss']:.6f}" for x in m1[2]))
    if problems:
        print("\n".join(problems))
        print("FAILED: pipeline stages sharing the embedding table do not train as one stage")
        return 1
    print("pipeline embedding: tied embeddings and the MTP module on stages train as one "
          "stage within 1e-5; PP=2 == PP=4 == interleaved bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
