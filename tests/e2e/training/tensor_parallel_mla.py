#!/usr/bin/env python3
"""Tensor parallelism with latent attention (parallel.tensor over layers/latent_attention.*)
and DeepSeekMoE blocks (computed whole on every rank of the tensor group, block.hpp) end to
end: tiny-moe's attention without its experts (model.preset tiny-moe, model.n_routed_experts
0: 4 blocks of latent attention, 4 heads, kv_lora 64, rope 32, and dense MLPs), then tiny-moe
itself (block 0 dense, 1-3 MoE with a sigmoid router, its correction bias moved at 0.01 a
step, the balance loss), the same global batch (micro-batch 2 x 4 micro-batches = 8
sequences) in every layout, 6 steps, the consistency check every step (the replicated
latent projections, norms and MoE layers compared across the tensor slices):

  TP=2, TP=4                                  vs 1 rank: losses within 1e-5 relative, the
  TP=2 with a query latent (q_lora_rank 32)   final parameters within 1e-5 relative L2 as
                                              one vector, each tensor within 5e-5 (the
                                              tensor_parallel.py bounds, for its reasons)
  the TP=2 checkpoint at step 3               resumes on 1 rank: steps 4-6 within the
                                              bounds of TP=2's own
  tiny-moe TP=2                               vs 1 rank: the bounds; step 1's expert loads
                                              and biases equal, its balance loss within 1e-5
  tiny-moe DP=2 x expert 2 x TP=2 (4 ranks),  vs DP=2 x expert 2 (2 ranks): the bounds
  and x PP=2 (8 ranks)
  tiny-moe TP=2 traffic                       the MoE blocks' MLPs send nothing over the
                                              tensor group (metrics' tensor_allreduce_bytes)
  tiny with the MTP module TP=2 and TP=2 +    vs 1 rank: the bounds, the MTP losses too;
  SP, tiny-moe with it TP=2, TP=2 x PP=2 and  the traffic of tiny's counted; TP=2 + SP's
  TP=2 x PP=2 + SP (the last stage's copy of  step 1 loss TP=2's bit for bit (its MTP
  the table sliced)                           loss within 1e-8 through OpenBLAS); tiny-moe
                                              with it TP=2 x PP=2: step 1's loads and biases
                                              of its 4 MoE blocks equal, as above
  tiny with the MTP module TP=2 + SP,         vs TP=2 + SP: bit-identical
  training.recompute full

Latent attention with TP=2 + SP, with recompute full and selective under TP=2 + SP, and
DP=2 x TP=2 x PP=2 (+ SP) are sequence_parallel.py's tiny-moe runs; tensor_parallel.py runs
TP=2 with recompute full and DP=2 x TP=2 x PP=2 for the standard attention.

What would fail: a head's slice of q_proj / kv_b_proj / o_proj taken from the wrong rows
or columns, the latents' gradients not summed over the group (each rank's replicated
weights would then step on its own heads' share: the consistency check stops the run at
step 1), or summed twice into the input gradient (the losses move by 1e-2 or more).

usage: tensor_parallel_mla.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import os
import sys

from training_e2e import TINY_WIDTHS, Comparisons, deck_width, setup

TOL = 1e-5
STEPS, EVERY = 6, 3  # the checkpoint of step EVERY is resumed
SEQ, MICRO, GLOBAL = 64, 2, 8  # not 32: tiny-moe's tensors came within 1.1x of the bound


def main():
    st = setup(SEQ)
    check = Comparisons(TOL, 5 * TOL, STEPS)
    problems = check.problems
    mla = ["model.preset=tiny-moe", "model.n_routed_experts=0", "debug.consistency_every=1"]

    def run(name, ranks, sets, layout, model=None):
        out, recs, params = st.run(name, ranks, (mla if model is None else model) + sets, layout,
                                   seq=SEQ, micro=MICRO, global_batch=GLOBAL, steps=STEPS,
                                   checkpoint_every=EVERY)
        return out, [(x["step"], x["loss"], x["grad_norm"]) for x in recs], params, recs

    def traffic(name, r, want, note=""):
        """The run's tensor-group traffic (metrics.jsonl, its last step) is `want` bytes."""
        got = r[2][-1].get("tensor_allreduce_bytes")
        if got != want:
            problems.append(f"{name}: metrics.jsonl says tensor_allreduce_bytes {got}, "
                            f"expected {want}")
        else:
            print(f"{name}: {want:.0f} bytes (all-reduce equivalents) over the tensor group per "
                  f"step{note}")

    lay = "data {} x tensor {} x pipeline {}"
    _, *tp1 = run("tp1", 1, [], lay.format(1, 1, 1))
    tp2_out, *tp2 = run("tp2", 2, ["parallel.tensor=2"], lay.format(1, 2, 1))
    check.within("latent attention TP=2 vs 1 rank", tp2, tp1)
    _, *tp4 = run("tp4", 4, ["parallel.tensor=4"], lay.format(1, 4, 1))
    check.within("latent attention TP=4 vs 1 rank", tp4, tp1)
    # Latent attention with SP and with recompute full: sequence_parallel.py's tiny-moe runs
    # (TP=2 + SP vs TP=2 and 1 rank; its recompute full and selective bit for bit); on
    # DP=2 x TP=2 x PP=2: the tiny-moe run below (with expert 2) and the SP runs below.
    q = ["model.q_lora_rank=32"]
    _, *q1 = run("q-tp1", 1, q, lay.format(1, 1, 1))
    _, *q2 = run("q-tp2", 2, q + ["parallel.tensor=2"], lay.format(1, 2, 1))
    check.within("latent attention with a query latent TP=2 vs 1 rank", q2, q1)
    _, *r1 = run("resume-tp2-on-1", 1,
                 [f"checkpoint.resume={os.path.join(tp2_out, f'checkpoints/step-{EVERY}.h5')}"],
                 lay.format(1, 1, 1))
    check.within("latent attention TP=2 checkpoint resumed on 1 rank vs TP=2", r1, tp2,
                 first_step=EVERY + 1)

    # DeepSeekMoE blocks: each rank of a tensor group computes them whole.
    # At tiny's own widths: at the deck's half width the experts' last bits move further
    # between layouts (an expert's weights 6.9e-4 from one rank's against the 5e-5 bound).
    moe = ["model.preset=tiny-moe", *TINY_WIDTHS, "model.moe.bias_update_rate=0.01",
           "model.moe.seq_aux_loss_alpha=0.01", "debug.consistency_every=1"]
    _, *m1 = run("moe-tp1", 1, [], lay.format(1, 1, 1), moe)
    _, *m2 = run("moe-tp2", 2, ["parallel.tensor=2"], lay.format(1, 2, 1), moe)
    check.within("tiny-moe TP=2 vs 1 rank", m2, m1)

    def balance_same(name, a, b, blocks=3):
        """Step 1's expert loads and biases equal (the same choices: exact counts) in its
        `blocks` MoE blocks, its balance loss within TOL (the row-parallel o_proj rounds the
        MoE input's last bits)."""
        got, want = a[2][0], b[2][0]
        err = abs(got["aux_loss"] - want["aux_loss"]) / abs(want["aux_loss"])
        if got.get("moe") != want.get("moe") or len(want.get("moe") or []) != blocks or \
                err > TOL:
            problems.append(f"{name}: step 1's MoE blocks {got.get('moe')} vs {want.get('moe')}, "
                            f"balance loss within {err:.2e}")
        else:
            print(f"{name}: step 1's {blocks} MoE blocks' loads and biases bit for bit, balance "
                  f"loss within {err:.2e}")

    balance_same("tiny-moe TP=2 vs 1 rank", m2, m1)
    # tiny-moe TP=2 x PP=2: with the MTP module below (its 3 blocks' balance and the module's).
    ep = ["parallel.expert=2", "parallel.backend=mpi"]
    _, *e2 = run("moe-dp2ep2", 2, ep, lay.format(2, 1, 1), moe)
    _, *e2t2 = run("moe-dp2ep2tp2", 4, ep + ["parallel.tensor=2"], lay.format(2, 2, 1), moe)
    check.within("tiny-moe DP=2 x expert 2 x TP=2 vs DP=2 x expert 2", e2t2, e2)
    _, *e2t2p2 = run("moe-dp2ep2tp2pp2", 8, ep + ["parallel.tensor=2", "parallel.pipeline=2"],
                     lay.format(2, 2, 2), moe)
    check.within("tiny-moe DP=2 x expert 2 x TP=2 x PP=2 vs DP=2 x expert 2", e2t2p2, e2)
    # The tensor group's traffic, in all-reduces of the residual stream (MICRO x SEQ x 256
    # fp32, tiny's width): 4 per dense block (its attention's and MLP's, forward and backward), 2 per MoE
    # block (its attention's), 2 at the ends; the latents' gradients (MICRO x SEQ x (64 + 32))
    # per block; the vocabulary-parallel cross-entropy's 20 bytes a token.
    whole = MICRO * SEQ * 256 * 4
    want = (GLOBAL // MICRO) * ((4 * 1 + 2 * 3 + 2) * whole + 4 * MICRO * SEQ * 96 * 4 +
                                MICRO * SEQ * 20)
    traffic("tiny-moe TP=2", m2, want, ": none for the MoE blocks' MLPs")

    # The MTP module (model.mtp_depth 1): its block split as the model's, its embedding and
    # head the vocabulary-parallel ones, enorm / hnorm / eh_proj replicated.
    dense_mtp = ["model.mtp_depth=1", "debug.consistency_every=1"]

    def mtp_within(name, a, b):
        check.key_within(name, a[2], b[2], "mtp_loss")

    _, *d1 = run("mtp-tp1", 1, [], lay.format(1, 1, 1), dense_mtp)
    _, *d2 = run("mtp-tp2", 2, ["parallel.tensor=2"], lay.format(1, 2, 1), dense_mtp)
    check.within("tiny with MTP TP=2 vs 1 rank", d2, d1)
    mtp_within("tiny with MTP TP=2 vs 1 rank", d2, d1)
    # Traffic: tiny's 4 dense blocks (4 each), the ends (2), the MTP module's block (4), its
    # embedding (1) and its head's input gradient (1); two cross-entropies of 20 bytes a token.
    width = deck_width(st.deck)
    whole = MICRO * SEQ * width * 4
    want = (GLOBAL // MICRO) * ((4 * 4 + 2 + 6) * whole + 2 * MICRO * SEQ * 20)
    traffic("tiny with MTP TP=2", d2, want)
    # With sequence parallelism the module keeps this rank's rows as the blocks do: its
    # embedding's rows reduce-scattered, its block split by rows, its head's norm gathered;
    # eh_proj's weight gradient from the gathered rows (the same whole sum on every rank:
    # the consistency check compares it every step). The first step's main loss is TP=2's
    # bit for bit. Its MTP loss is too where the products' bits do not depend on their row
    # count (dstrain's own AVX-512 kernels); through OpenBLAS (a host without AVX-512) the
    # module's replicated eh_proj over this rank's N / 2 rows may take another kernel than
    # over all N rows: measured 8.4e-10 relative on an AMD EPYC host, bounded at 1e-8.
    sp = ["parallel.tensor=2", "parallel.sequence_parallel=true"]
    _, *ds2 = run("mtp-tp2-sp", 2, sp, lay.format(1, 2, 1), dense_mtp)
    first = [(r[2][0]["loss"], r[2][0]["mtp_loss"]) for r in (ds2, d2)]
    mtp_off = abs(first[0][1] - first[1][1]) / abs(first[1][1])
    if first[0][0] != first[1][0] or mtp_off > 1e-8:
        problems.append(f"tiny with MTP TP=2 + SP: step 1's losses {first[0]} are not TP=2's "
                        f"{first[1]} (the loss bit for bit, the MTP loss within 1e-8)")
    else:
        print(f"tiny with MTP TP=2 + SP: step 1's loss is TP=2's bit for bit {first[0][0]}, "
              f"its MTP loss within {mtp_off:.1e}")
    check.within("tiny with MTP TP=2 + SP vs 1 rank", ds2, d1)
    mtp_within("tiny with MTP TP=2 + SP vs 1 rank", ds2, d1)
    # Traffic (a reduce-scatter or an all-gather is half an all-reduce): 5 per block (the
    # MTP module's too), 2 at the main ends, 3.5 at the module's (embedding 1, head 1,
    # eh_proj's gathers 1.5); an all-reduce of d_model fp32 per norm: 2 per block, the final
    # one, and the module's enorm, hnorm, block's two and head's.
    want = (GLOBAL // MICRO) * ((5 * 5 + 2 + 3.5) * whole + (2 * 4 + 1 + 5) * width * 4 +
                                2 * MICRO * SEQ * 20)
    traffic("tiny with MTP TP=2 + SP", ds2, want)
    _, *ds2f = run("mtp-tp2-sp-full", 2, sp + ["training.recompute=full"], lay.format(1, 2, 1),
                   dense_mtp)
    check.same_bits("tiny with MTP TP=2 + SP recompute full vs TP=2 + SP", ds2f, ds2)
    v3ish = moe + ["model.mtp_depth=1"]
    _, *v1 = run("moe-mtp-tp1", 1, [], lay.format(1, 1, 1), v3ish)
    _, *v2 = run("moe-mtp-tp2", 2, ["parallel.tensor=2"], lay.format(1, 2, 1), v3ish)
    check.within("tiny-moe with MTP TP=2 vs 1 rank", v2, v1)
    mtp_within("tiny-moe with MTP TP=2 vs 1 rank", v2, v1)
    _, *v2p2 = run("moe-mtp-tp2pp2", 4, ["parallel.tensor=2", "parallel.pipeline=2"],
                   lay.format(1, 2, 2), v3ish)
    check.within("tiny-moe with MTP TP=2 x PP=2 vs 1 rank", v2p2, v1)
    mtp_within("tiny-moe with MTP TP=2 x PP=2 vs 1 rank", v2p2, v1)
    balance_same("tiny-moe with MTP TP=2 x PP=2 vs 1 rank", v2p2, v1, blocks=4)
    _, *vs2p2 = run("moe-mtp-tp2pp2-sp", 4, sp + ["parallel.pipeline=2"], lay.format(1, 2, 2),
                    v3ish)
    check.within("tiny-moe with MTP TP=2 x PP=2 + SP vs 1 rank", vs2p2, v1)
    mtp_within("tiny-moe with MTP TP=2 x PP=2 + SP vs 1 rank", vs2p2, v1)

    print("losses 1 rank: " + " ".join(f"{s[1]:.6f}" for s in tp1[0]))
    if problems:
        print("\n".join(problems))
        print("FAILED: tensor parallelism with latent attention does not train as one rank does")
        return 1
    print("tensor parallelism with latent attention: TP=2, TP=4, TP=2 + SP, DP x TP x PP train "
          "as one rank; its checkpoints resume on one rank; with DeepSeekMoE blocks and the "
          "MTP module too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
