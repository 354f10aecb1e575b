#!/usr/bin/env python3
"""Pipeline stages holding DeepSeekMoE blocks (parallel.pipeline with model.preset
tiny-moe: latent attention, block 0 dense, blocks 1-3 MoE with a sigmoid router, its
correction bias and the sequence-wise balance loss) end to end, the same global batch
(micro-batch 2 x 4 micro-batches = 8 sequences) in every layout, 6 steps, a bias update
rate fast enough to move the choices (0.01):

  PP=2, PP=4 (stage 0 holds the dense block only),
  PP=2 with training.recompute full,
  PP=2 with training.recompute selective,
  PP=2 interleaved (2 chunks per rank)     vs PP=1: bit-identical losses, gradient norms,
                                           balance losses, per-block expert loads and
                                           correction biases (metrics.jsonl's "moe"), and
                                           every tensor of final-params.h5
  PP=2 with model.moe.capacity_factor 0.5 vs PP=1 with it: the same, and the dropped rows
  DP=2 x PP=2 on 4 ranks, and interleaved  vs DP=2 on 2 ranks: the same, bit for bit
  DP=2 x expert 2 x PP=2 on 4 ranks,       vs DP=2 x expert 2 on 2 ranks: within 1e-9
  and x PP=4 on 8 (stage 0 without MoE)
  (each rank storing its own experts,      (losses, norms), 1e-6 (parameters): see below
  parallel.backend auto resolving to mpi)
  the same with ZeRO 1 (the replicated     vs ZeRO 0: bit-identical
  tensors over the data group, the own
  experts over the expert-data group)
  its checkpoint resumed on 1 rank         its own steps 4-6 within 1e-5
  a NaN in an own expert's gradient        exit 6 naming the rank, its stage, the tensor
  the PP=2 checkpoint at step 3            == PP=1's, tensor by tensor, bit for bit
  it resumes on PP=1                       == PP=1's steps 4-6 bit for bit
(the validation losses of steps 3 and 6, through the stages' forward, alike).

Why bit-identical: a stage runs exactly the layers of a one-stage run on the same
micro-batches (1F1B keeps a micro-batch per activation record, each with its own MoE
routing); its gradient accumulates the micro-batches in the same order; the loss sums
add +0 from the other stages; the balance loss's terms (one per micro-batch and MoE
block) are gathered over the pipeline group and added in the one-stage run's order (the
interleaved chunks' blocks put back in the model's order, as the loads and biases); the
expert loads are exact counts, summed over the data group per stage, and each stage moves
its own blocks' biases from them. Nothing changes the order of a floating-point sum, so
any difference is a bug (a micro-batch's routing overwritten by another in flight, the
balance loss's gradient lost on a stage, a bias moved from another stage's loads).

usage: pipeline_moe.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import os
import sys

import h5py
import numpy as np

from training_e2e import read_run, setup

STEPS, EVERY = 6, 3  # the checkpoint of step EVERY is resumed
SEQ, MICRO, GLOBAL = 32, 2, 8


def main():
    st = setup(SEQ)
    problems = []

    def run(name, ranks, sets, layout):
        out, r, _ = st.train(name, ranks,
                             ["model.preset=tiny-moe", "model.moe.bias_update_rate=0.01",
                              "model.moe.seq_aux_loss_alpha=0.01", f"eval.every_steps={EVERY}",
                              *sets],
                             seq=SEQ, micro=MICRO, global_batch=GLOBAL, steps=STEPS,
                             checkpoint_every=EVERY)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name} exited {r.returncode}")
        if layout not in r.stdout + r.stderr:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name}: the log does not say '{layout}'")
        recs, params = read_run(out)
        steps = [(x["step"], x["loss"], x["grad_norm"], x["aux_loss"], x["moe"],
                  x.get("moe_dropped_rows"))
                 for x in recs if x.get("type") == "step"]
        evals = [(x["step"], x["val_loss"]) for x in recs if x.get("type") == "eval"]
        return out, steps, params, evals

    def same_bits(name, a, b, first_step=1):
        """a: (steps, params, evals) of the run checked; b: the reference's."""
        ref_steps = [s for s in b[0] if s[0] >= first_step]
        ref_evals = [e for e in b[2] if e[0] >= first_step]
        if a[2] != ref_evals or not ref_evals:
            problems.append(f"{name}: validation losses {a[2]} vs {ref_evals}")
        if len(a[0]) != len(ref_steps) or not ref_steps:
            problems.append(f"{name}: {len(a[0])} steps logged, the reference {len(ref_steps)}")
            return
        for got, want in zip(a[0], ref_steps):
            if got[:4] != want[:4]:
                problems.append(f"{name}: step {want[0]}: (step, loss, norm, aux loss) {got[:4]} "
                                f"vs {want[:4]}")
                break
            if got[4] != want[4] or len(want[4]) != 3:
                problems.append(f"{name}: step {want[0]}: the MoE blocks' loads and biases "
                                f"{got[4]} vs {want[4]}")
                break
            if got[5] != want[5]:
                problems.append(f"{name}: step {want[0]}: {got[5]} rows dropped by the "
                                f"capacity vs {want[5]}")
                break
        differing = [k for k in b[1] if not np.array_equal(a[1].get(k), b[1][k])]
        biases = [k for k in b[1] if "e_score_correction_bias" in k]
        if sorted(a[1]) != sorted(b[1]) or differing or len(biases) != 3:
            problems.append(f"{name}: {len(differing)} tensors differ in final-params.h5"
                            + (f", first {differing[0]}" if differing else "")
                            + f" ({len(biases)} correction biases)")
        else:
            print(f"{name}: bit-identical ({len(a[0])} steps with aux loss and 3 MoE blocks' "
                  f"balance, {len(a[1])} tensors with {len(biases)} correction biases)")

    lay = "data {} x tensor 1 x pipeline {}"
    pp1_out, *pp1 = run("pp1", 1, [], lay.format(1, 1))
    moved = [k for k in pp1[1] if "e_score_correction_bias" in k and np.any(pp1[1][k] != 0)]
    if len(moved) != 3 or pp1[0][-1][3] <= 0:
        problems.append(f"PP=1: the correction biases moved in {len(moved)} of 3 blocks, the "
                        f"balance loss {pp1[0][-1][3]}: the test does not exercise balancing")
    pp2_out, *pp2 = run("pp2", 2, ["parallel.pipeline=2"], lay.format(1, 2))
    same_bits("PP=2 vs PP=1", pp2, pp1)
    _, *pp4 = run("pp4", 4, ["parallel.pipeline=4"], lay.format(1, 4))
    same_bits("PP=4 vs PP=1", pp4, pp1)
    _, *rec = run("pp2-recompute", 2, ["parallel.pipeline=2", "training.recompute=full"],
                  lay.format(1, 2))
    same_bits("PP=2 recompute full vs PP=1 (none)", rec, pp1)
    _, *sel = run("pp2-selective", 2, ["parallel.pipeline=2", "training.recompute=selective"],
                  lay.format(1, 2))
    same_bits("PP=2 recompute selective vs PP=1 (none)", sel, pp1)
    # Interleaved, 2 chunks per rank: rank 0 holds blocks 0 (dense) and 2, rank 1 blocks 1
    # and 3. The balance-loss terms, loads and biases of each rank's chunks are put back
    # in the model's block order (2 between 1 and 3).
    inter = ["parallel.pipeline=2", "parallel.pipeline_schedule=interleaved",
             "parallel.virtual_stages=2"]
    _, *pv2 = run("pp2v2", 2, inter, lay.format(1, 2))
    same_bits("PP=2 interleaved vs PP=1", pv2, pp1)
    # The experts' capacity: the rows each stage drops, summed over the stages.
    cap = ["model.moe.capacity_factor=0.5"]
    _, *cap1 = run("pp1-capacity", 1, cap, lay.format(1, 1))
    _, *cap2 = run("pp2-capacity", 2, cap + ["parallel.pipeline=2"], lay.format(1, 2))
    same_bits("PP=2 capacity 0.5 vs PP=1 capacity 0.5", cap2, cap1)
    if not all(s[5] and s[5] > 0 for s in cap1[0]):
        problems.append(f"capacity 0.5 dropped no rows: {[s[5] for s in cap1[0]]}")
    _, *dp2 = run("dp2", 2, [], lay.format(2, 1))
    _, *dp2pp2 = run("dp2pp2", 4, ["parallel.pipeline=2"], lay.format(2, 2))
    same_bits("DP=2 x PP=2 vs DP=2", dp2pp2, dp2)
    # ZeRO 1 shards each stage's buffers over its data ranks, the biases moving after the
    # parameters are gathered back: DP=2 x expert 2 x PP=2 ZeRO 1 below (its replicated
    # tensors, the routers and biases among them, sharded over the data group as here).
    _, *dpv2 = run("dp2pp2v2", 4, inter, lay.format(2, 2))
    same_bits("DP=2 x PP=2 interleaved vs DP=2", dpv2, dp2)
    # parallel.backend auto: MPI, with stages or without (each rank stores its own experts,
    # summed over the ranks holding the same ones: no flat shared-memory sum).
    ep = ["parallel.expert=2"]

    def eplay(data, stages):
        return lay.format(data, stages) + " (experts over groups of 2) | comm mpi"

    _, *ep2 = run("dp2ep2", 2, ep, eplay(2, 1))
    ep2pp2_out, *ep2pp2 = run("dp2ep2pp2", 4, ep + ["parallel.pipeline=2"], eplay(2, 2))
    # Not bits: both store each rank's own experts, but without stages the gradient norm
    # adds its squares by group (the replicated tensors, then the experts' summed over the
    # expert group), with stages tensor by tensor in the model's order (each expert's from
    # its holder). The norm may differ in its last bit, and through the clipping factor
    # the parameters by about 1e-9.
    def near(name, a, b):
        worst = 0.0
        for got, want in zip(a[0], b[0]):
            for g, w in zip(got[1:4], want[1:4]):
                worst = max(worst, abs(g - w) / max(abs(w), 1e-30))
        wp = max(float(np.linalg.norm(a[1][k].astype(np.float64) - b[1][k]) /
                       max(np.linalg.norm(b[1][k].astype(np.float64)), 1e-30)) for k in b[1])
        if len(a[0]) != len(b[0]) or worst > 1e-9 or wp > 1e-6 or sorted(a[1]) != sorted(b[1]):
            problems.append(f"{name}: losses, norms and aux losses within {worst:.2e} (bound "
                            f"1e-9), parameters {wp:.2e} (1e-6)")
        else:
            print(f"{name}: losses, norms, aux losses within {worst:.2e}, parameters within "
                  f"{wp:.2e} relative L2")

    near("DP=2 x expert 2 x PP=2 vs DP=2 x expert 2", ep2pp2, ep2)
    # Four stages: stage 0 holds the dense block 0 only (no experts to split), the others
    # one MoE block each, storing their own experts (a stage without an MoE
    # block no longer makes every stage store every expert). The same bound.
    _, *ep2pp4 = run("dp2ep2pp4", 8, ep + ["parallel.pipeline=4"], eplay(2, 4))
    near("DP=2 x expert 2 x PP=4 (stage 0 without MoE) vs DP=2 x expert 2", ep2pp4, ep2)
    # ZeRO 1 over the stage's own experts (sharded over the expert-data group of 1) and its
    # replicated tensors (over the data group): ZeRO 0's bits.
    _, *ep2pp2z = run("dp2ep2pp2-zero1", 4, ep + ["parallel.pipeline=2", "parallel.zero_stage=1"],
                      eplay(2, 2))
    same_bits("DP=2 x expert 2 x PP=2 ZeRO 1 vs ZeRO 0", ep2pp2z, ep2pp2)
    # Its checkpoint holds every expert whole (each written by its holder): it resumes on
    # PP=1 with every expert on every rank, steps 4-6 as the run's own.
    _, *epr = run("resume-ep2pp2-pp1", 1,
                  [f"checkpoint.resume={os.path.join(ep2pp2_out, f'checkpoints/step-{EVERY}.h5')}"],
                  lay.format(1, 1))
    worst = max(abs(g[1] - w[1]) / abs(w[1]) for g, w in zip(epr[0], ep2pp2[0][EVERY:]))
    if len(epr[0]) != STEPS - EVERY or worst > 1e-5:
        problems.append(f"the DP=2 x expert 2 x PP=2 checkpoint resumed on 1 rank: "
                        f"{len(epr[0])} steps, losses within {worst:.2e} of its own (1e-5)")
    else:
        print(f"DP=2 x expert 2 x PP=2 checkpoint resumed on 1 rank: steps 4-6 within "
              f"{worst:.2e} of its own")

    # A NaN in an own expert's gradient on stage 1 (rank 3 holds experts 4-7 of block 3):
    # named with its rank, stage and tensor (the own experts' buckets are scanned too).
    _, r, _ = st.train("nan-ep2pp2", 4, ["model.preset=tiny-moe", *ep, "parallel.pipeline=2",
                                          "debug.inject_nan_step=2"],
                       seq=SEQ, micro=MICRO, global_batch=GLOBAL, steps=3)
    want = ("non-finite gradients at step 2: first on rank 3 (pipeline stage 1), tensor "
            "model.layers.3.mlp.experts.4.down_proj.weight[0] (debug.nan_policy: abort)")
    if r.returncode != 6 or want not in r.stdout + r.stderr:
        print(r.stdout + r.stderr)
        problems.append(f"nan in an own expert: exit {r.returncode} (want 6), or the log does "
                        f"not say '{want}'")
    else:
        print("nan in an own expert on stage 1: named with its rank, stage and tensor")

    # The checkpoints hold the whole model whatever the layout: PP=2's == PP=1's.
    ck = f"checkpoints/step-{EVERY}.h5"

    def datasets(f):
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset)
                     and (n.startswith("params/") or n.startswith("optimizer/")) else None)
        return names

    with h5py.File(os.path.join(pp1_out, ck), "r") as a, \
            h5py.File(os.path.join(pp2_out, ck), "r") as b:
        names, bnames = datasets(a), datasets(b)
        differing = [n for n in names if n not in b or not np.array_equal(a[n][()], b[n][()])]
        if sorted(names) != sorted(bnames) or differing or not names:
            problems.append(f"checkpoint step {EVERY}: PP=2's {len(bnames)} tensors vs PP=1's "
                            f"{len(names)}, {len(differing)} differ")
        else:
            print(f"checkpoint step {EVERY}: PP=2 == PP=1 ({len(names)} tensors, bit for bit)")

    resume = f"checkpoint.resume={os.path.join(pp2_out, ck)}"
    _, *r1 = run("resume-pp1", 1, [resume], lay.format(1, 1))
    same_bits("PP=2 checkpoint resumed on PP=1 vs PP=1", r1, pp1, first_step=EVERY + 1)

    print("losses PP=1: " + " ".join(f"{s[1]:.6f}" for s in pp1[0]))
    print("aux losses PP=1: " + " ".join(f"{s[3]:.4e}" for s in pp1[0]))
    if problems:
        print("\n".join(problems))
        print("FAILED: pipeline stages with DeepSeekMoE blocks do not give the one-stage run")
        return 1
    print("pipeline moe: PP=2 == PP=4 == PP=2 interleaved == PP=1 bit for bit with MoE blocks; "
          "DP=2 x PP=2 == DP=2; "
          "expert 2 x PP=2 as expert 2; checkpoints resume across layouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
