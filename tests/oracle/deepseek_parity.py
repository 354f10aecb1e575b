#!/usr/bin/env python3
"""Oracle: DeepSeek-V2/V3 models (multi-head latent attention, DeepSeekMoE) against Hugging
Face transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM (code none of us wrote),
built from the same config (fp32, eager attention, rope_scaling None or YaRN) and loaded with our
exact initial weights.

As llama_parity.py: model_dump writes our initial weights, a fixed batch, our logits, loss
and every parameter gradient; transformers recomputes them and every comparison must hold:
  loss:   relative error <= 1e-5;  logits and every gradient: relative L2 error <= 1e-4
(fp32 arithmetic over reductions of a few thousand terms in different orders, with margin).

transformers is pinned (tests/oracle/requirements.txt, 5.24.0) at a version whose V3
router takes the chosen experts' weights from the unbiased scores and fills the dropped
groups with -inf, as DeepSeek's reference (its V2 router fills 0.0: the V2 group case
says why that cannot change the choice). Its routers have no balance loss and no bias
update (the bias is a zero buffer): moe_router_test checks those by closed forms and
finite differences, checkpoint_moe and training_rank_invariance_moe the update in training.

The sequence-wise balance loss, which transformers lacks, is added to the reference's
objective in torch (balance_loss(), from the routers' logits and choices caught by forward
hooks) for the *_balance_loss cases: every gradient then carries it.

RoPE: transformers' DeepseekV3 (rope_interleave) writes the rotated interleaved pairs of
q_pe and k_pe de-interleaved; ours keeps them in place (as DeepSeek's reference and
transformers' DeepseekV2). Both permute queries and keys alike, so logits and gradients
agree (kernels::rope_interleaved_forward).

Then the parameter counts of the deepseek-v2-lite and deepseek-v3 presets: our layout pass
against transformers' models built on the meta device (nothing allocated), parameters plus
the routers' e_score_correction_bias buffers (which we store with the parameters); and the
active parameters (plan.hpp's closed form) against transformers' parameters less the
routed experts a token skips (n_routed - top-k per MoE block). The deepseek-v3 preset's
multi-token prediction module is counted apart (transformers builds none): one of
transformers' MoE decoder layers plus its norms and eh_proj.

usage: deepseek_parity.py MODEL_DUMP WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np
import torch
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                          DeepseekV3ForCausalLM)

TOL_REL_L2 = 1e-4
TOL_LOSS = 1e-5

SMALL = ["model.vocab_size=61", "model.d_model=48", "model.n_layers=2", "model.n_heads=4",
         "model.n_kv_heads=4", "model.ffn_dim=64", "model.max_seq_len=160"]
MLA = ["model.kv_lora_rank=16", "model.qk_nope_head_dim=12", "model.qk_rope_head_dim=8",
       "model.v_head_dim=10"]

CASES = {
    # name: (overrides, batch, seq)
    "mla_q_full": (SMALL + MLA, 2, 16),
    "mla_q_lora": (SMALL + MLA + ["model.q_lora_rank=24", "model.rope_theta=500000"], 3, 12),
    # No q_nope columns (the scores are the RoPE product alone); 3 query blocks of 64 rows.
    "mla_no_nope_blocks": (SMALL + ["model.kv_lora_rank=8", "model.qk_nope_head_dim=0",
                                    "model.qk_rope_head_dim=16", "model.v_head_dim=8",
                                    "model.q_lora_rank=12"], 2, 150),
    # YaRN (rope_scaling yarn, DeepSeek-V3's long-context RoPE): the RoPE key width 8 over
    # an original context of 24 puts the ramp between dims 0 and 1 (frequency 0 kept,
    # the others interpolated by 4); mscale 1 over mscale_all_dim 0.8 makes the tables'
    # factor 1.024 and the softmax factor 1.231, so every part of it shows.
    "mla_yarn": (SMALL + MLA + ["model.q_lora_rank=24", "model.rope_scaling.type=yarn",
                                "model.rope_scaling.factor=4",
                                "model.rope_scaling.original_max_seq_len=24",
                                "model.rope_scaling.mscale=1",
                                "model.rope_scaling.mscale_all_dim=0.8"], 2, 40),
    # Latent attention with the dense MLP in every block (no MoE) is every case above.
    # DeepSeekMoE (the balance loss off: transformers has none; moe_router_test checks it):
    # sigmoid router, one dense block, 8 routed experts top-2 plus one shared, renormalised
    # weights times 2.5 (V3's rule).
    "moe_v3": (SMALL + MLA + ["model.n_layers=3", "model.n_routed_experts=8",
                              "model.n_shared_experts=1", "model.num_experts_per_tok=2",
                              "model.moe_intermediate_size=16", "model.first_k_dense_replace=1",
                              "model.routed_scaling_factor=2.5",
                              "model.moe.seq_aux_loss_alpha=0"], 2, 16),
    # Group-limited routing, non-degenerate: 4 groups of 2, keep 2 groups (4 experts), top-3
    # of those; two shared experts; weights not renormalised; every block MoE.
    "moe_groups": (SMALL + MLA + ["model.q_lora_rank=20", "model.n_routed_experts=8",
                                  "model.n_shared_experts=2", "model.num_experts_per_tok=3",
                                  "model.moe_intermediate_size=12", "model.n_group=4",
                                  "model.topk_group=2", "model.norm_topk_prob=false",
                                  "model.moe.seq_aux_loss_alpha=0"], 2, 20),
    # 16 experts in 4 groups, keep 3 groups (12 experts), top-4 of them, no shared expert.
    "moe_groups_noshared": (SMALL + MLA + ["model.n_routed_experts=16",
                                           "model.n_shared_experts=0",
                                           "model.num_experts_per_tok=4",
                                           "model.moe_intermediate_size=8", "model.n_group=4",
                                           "model.topk_group=3",
                                           "model.moe.seq_aux_loss_alpha=0"], 3, 12),
    # The sequence-wise balance loss on (alpha 0.05, large enough to matter in every
    # gradient): transformers has none, so the reference adds it in torch from the
    # routers' logits and choices (balance_loss below) to the cross-entropy.
    "moe_v3_balance_loss": (SMALL + MLA + ["model.n_layers=3", "model.n_routed_experts=8",
                                           "model.n_shared_experts=1",
                                           "model.num_experts_per_tok=2",
                                           "model.moe_intermediate_size=16",
                                           "model.first_k_dense_replace=1",
                                           "model.moe.seq_aux_loss_alpha=0.05"], 3, 16),
    "moe_v2_balance_loss": (SMALL + MLA + ["model.n_routed_experts=6",
                                           "model.n_shared_experts=1",
                                           "model.num_experts_per_tok=2",
                                           "model.moe_intermediate_size=16",
                                           "model.norm_topk_prob=false", "model.moe.score=softmax",
                                           "model.moe.seq_aux_loss_alpha=0.05"], 2, 16),
    # DeepSeek-V2's rule (softmax scores, greedy top-k, no renormalisation) against
    # transformers' DeepseekV2ForCausalLM.
    "moe_v2_softmax": (SMALL + MLA + ["model.n_routed_experts=6", "model.n_shared_experts=2",
                                      "model.num_experts_per_tok=2",
                                      "model.moe_intermediate_size=16",
                                      "model.first_k_dense_replace=1",
                                      "model.norm_topk_prob=false", "model.moe.score=softmax",
                                      "model.moe.seq_aux_loss_alpha=0"], 2, 16),
    # V2's group_limited_greedy: 3 groups of 4 scored by their best expert, keep 2 (8
    # experts), top-3. transformers fills the other groups' scores with 0.0, the reference
    # with -inf: the same choice, since softmax scores are positive and 3 <= 8 kept.
    "moe_v2_groups": (SMALL + MLA + ["model.n_routed_experts=12", "model.n_shared_experts=1",
                                     "model.num_experts_per_tok=3",
                                     "model.moe_intermediate_size=8", "model.n_group=3",
                                     "model.topk_group=2", "model.norm_topk_prob=false",
                                     "model.routed_scaling_factor=1.5",
                                     "model.moe.score=softmax",
                                     "model.moe.seq_aux_loss_alpha=0"], 2, 16),
}

PRESETS = {
    "deepseek-v2-lite": (DeepseekV2Config, DeepseekV2ForCausalLM, dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
        n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False)),
    "deepseek-v3": (DeepseekV3Config, DeepseekV3ForCausalLM, dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3,
        n_group=8, topk_group=4, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False)),
}


def rel_l2(ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))


def yarn_scaling(attrs):
    """transformers' rope_scaling dict for our model.rope_scaling (None without YaRN)."""
    if not attrs["yarn"]:
        return None
    return {"rope_type": "yarn", "factor": float(attrs["yarn_factor"]),
            "original_max_position_embeddings": int(attrs["yarn_original_max_seq_len"]),
            "beta_fast": float(attrs["yarn_beta_fast"]),
            "beta_slow": float(attrs["yarn_beta_slow"]),
            "mscale": float(attrs["yarn_mscale"]),
            "mscale_all_dim": float(attrs["yarn_mscale_all_dim"])}


def hf_model(attrs):
    """transformers' model of the dumped shape: V3 (sigmoid router) or V2 (softmax)."""
    i = lambda k: int(attrs[k])
    moe = i("n_routed_experts") > 0
    kw = dict(
        vocab_size=i("vocab_size"), hidden_size=i("d_model"), intermediate_size=i("ffn_dim"),
        num_hidden_layers=i("n_layers"), num_attention_heads=i("n_heads"),
        num_key_value_heads=i("n_heads"), max_position_embeddings=i("max_seq_len"),
        rms_norm_eps=float(attrs["norm_eps"]), rope_theta=float(attrs["rope_theta"]),
        rope_scaling=yarn_scaling(attrs), tie_word_embeddings=bool(attrs["tie_embeddings"]),
        q_lora_rank=i("q_lora_rank") or None, kv_lora_rank=i("kv_lora_rank"),
        qk_nope_head_dim=i("qk_nope_head_dim"), qk_rope_head_dim=i("qk_rope_head_dim"),
        v_head_dim=i("v_head_dim"), attention_bias=False, hidden_act="silu",
        # A dense model: every block keeps the dense MLP.
        first_k_dense_replace=i("first_k_dense_replace") if moe else i("n_layers"),
        n_routed_experts=i("n_routed_experts") if moe else 2,
        n_shared_experts=i("n_shared_experts") if moe else 1,
        num_experts_per_tok=i("num_experts_per_tok") if moe else 1,
        moe_intermediate_size=i("moe_intermediate_size") if moe else 1,
        n_group=i("n_group"), topk_group=i("topk_group"),
        norm_topk_prob=bool(attrs["norm_topk_prob"]),
        routed_scaling_factor=float(attrs["routed_scaling_factor"]),
        torch_dtype=torch.float32, attn_implementation="eager")
    if moe and attrs["moe_softmax"]:
        kw.pop("norm_topk_prob")
        method = "group_limited_greedy" if i("n_group") > 1 else "greedy"
        return DeepseekV2ForCausalLM(DeepseekV2Config(topk_method=method, **kw)).float()
    return DeepseekV3ForCausalLM(DeepseekV3Config(**kw)).float()


def to_hf_state(ours, model):
    """Our per-expert tensors stacked into transformers' fused expert tensors."""
    state = dict(ours)
    names = dict(model.named_parameters())
    for name in list(names):
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            n = names[name].shape[0]
            state[name] = torch.stack([torch.cat([state.pop(f"{prefix}{e}.gate_proj.weight"),
                                                  state.pop(f"{prefix}{e}.up_proj.weight")])
                                       for e in range(n)])
            state[prefix + "down_proj"] = torch.stack(
                [state.pop(f"{prefix}{e}.down_proj.weight") for e in range(n)])
    return state


def expert_grads(model):
    """transformers' gradients by our names (fused expert tensors split per expert)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            inter = p.shape[1] // 2
            for e in range(p.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = p.grad[e, :inter]
                out[f"{prefix}{e}.up_proj.weight"] = p.grad[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(p.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = p.grad[e]
        else:
            out[name] = p.grad
    return out


def capture_routing(model):
    """Forward hooks on every router: its logits and chosen experts, in layer order."""
    captured = []
    for module in model.modules():
        if type(module).__name__ in ("DeepseekV3TopkRouter", "DeepseekV2TopkRouter"):
            module.register_forward_hook(lambda m, args, out: captured.append((out[0], out[2])))
    return captured


def balance_loss(captured, attrs, batch, seq, valid):
    """Our objective's balance term (layers/moe_router.hpp), in torch: per MoE block and
    sequence alpha sum_i f_i P_i, f_i = E / (K T) #tokens choosing i (no gradient),
    P_i = mean_t s'_t,i (s' the scores normalised over the experts), each sequence
    weighted T / valid tokens like the mean cross-entropy's tokens (LanguageModel)."""
    alpha = float(attrs["seq_aux_loss_alpha"])
    E, K = int(attrs["n_routed_experts"]), int(attrs["num_experts_per_tok"])
    total = 0.0
    for logits, idx in captured:
        s = logits.sigmoid() if not attrs["moe_softmax"] else logits.softmax(-1)
        s = (s / s.sum(-1, keepdim=True)).view(batch, seq, E)
        counts = torch.zeros(batch, E).scatter_add_(
            1, idx.view(batch, seq * K), torch.ones(batch, seq * K))
        f = counts * E / (K * seq)
        P = s.mean(1)
        total = total + alpha * (f * P).sum() * seq / valid
    return total


def run_case(dump, workdir, name, sets, batch, seq):
    path = os.path.join(workdir, f"deepseek-{name}.h5")
    cmd = [dump, path, "--batch", str(batch), "--seq", str(seq)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True)
    problems = []
    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
        model = hf_model(attrs)
        ours = {k: torch.from_numpy(np.array(f["params"][k])) for k in f["params"]}
        state = to_hf_state(ours, model)
        missing, unexpected = model.load_state_dict(state, strict=False)
        # transformers builds zero-width shared experts for n_shared_experts = 0.
        sizes = {k: v.numel() for k, v in model.state_dict().items()}
        missing = [m for m in missing if "rotary" not in m and sizes.get(m, 1) > 0]
        if missing or unexpected:
            problems.append(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        tokens = torch.from_numpy(np.array(f["tokens"])).long()
        targets = torch.from_numpy(np.array(f["targets"])).long()
        captured = capture_routing(model)
        logits = model(input_ids=tokens).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        objective = loss
        if float(attrs["seq_aux_loss_alpha"]) > 0 and int(attrs["n_routed_experts"]) > 0:
            objective = loss + balance_loss(captured, attrs, batch, seq,
                                            float(attrs["valid_tokens"]))
        objective.backward()
        ours_loss = float(attrs["loss"])
        err = abs(ours_loss - loss.item()) / abs(loss.item())
        if err > TOL_LOSS:
            problems.append(f"loss {ours_loss!r} vs {loss.item()!r} (rel {err:.2e})")
        err = rel_l2(np.array(f["logits"]), logits.detach().numpy())
        if err > TOL_REL_L2:
            problems.append(f"logits rel L2 {err:.2e}")
        grads = expert_grads(model)
        worst = ("", 0.0)
        n_grads = 0
        for k in f["grads"]:
            if k.endswith("e_score_correction_bias"):
                continue  # a buffer, moved by the balancing rule: no gradient on either side
            n_grads += 1
            ref = grads.get(k)
            if ref is None:
                problems.append(f"{k}: no reference gradient")
                continue
            err = rel_l2(np.array(f["grads"][k]), ref.numpy())
            worst = max(worst, (k, err), key=lambda t: t[1])
            if err > TOL_REL_L2:
                problems.append(f"grad {k}: rel L2 {err:.2e}")
    print(f"{name}: loss {ours_loss:.6f} (ref {loss.item():.6f}), {n_grads} gradients, "
          f"worst {worst[0]} rel L2 {worst[1]:.2e}")
    return [f"{name}: {p}" for p in problems]


def count_ours(dump, preset, *sets):
    args = [dump, "--count", "--set", f"model.preset={preset}"]
    for x in sets:
        args += ["--set", x]
    return int(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def check_counts(dump):
    problems = []
    for preset, (config_cls, model_cls, kw) in PRESETS.items():
        # transformers builds no multi-token prediction module: the main model's count.
        ours = count_ours(dump, preset, "model.mtp_depth=0")
        with torch.device("meta"):
            model = model_cls(config_cls(**kw))
        params = sum(p.numel() for p in model.parameters())
        bias = sum(b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n)
        routed = kw["n_routed_experts"] - kw["num_experts_per_tok"]
        moe_layers = kw["num_hidden_layers"] - kw["first_k_dense_replace"]
        skipped = moe_layers * routed * 3 * kw["hidden_size"] * kw["moe_intermediate_size"]
        active = int(subprocess.run([dump, "--count-active", "--set", f"model.preset={preset}",
                                     "--set", "model.mtp_depth=0"],
                                    check=True, capture_output=True, text=True).stdout)
        print(f"{preset}: parameters ours {ours}, transformers {params + bias} "
              f"({params} + {bias} correction bias); active ours {active}, "
              f"transformers {params - skipped}")
        if ours != params + bias:
            problems.append(f"{preset}: parameter count {ours} != transformers {params + bias}")
        if active != params - skipped:
            problems.append(f"{preset}: active parameters {active} != {params - skipped}")
        if preset == "deepseek-v3":
            # Its MTP module (the preset's mtp_depth 1): enorm, hnorm, shared_head.norm,
            # eh_proj (C, 2C) and one MoE decoder layer as transformers builds it (with its
            # correction bias); V3's checkpoint also stores copies of the embedding and head.
            C = kw["hidden_size"]
            layer = model.model.layers[-1]
            block = sum(p.numel() for p in layer.parameters()) + \
                sum(b.numel() for n, b in layer.named_buffers() if "e_score_correction_bias" in n)
            want = 3 * C + 2 * C * C + block
            mtp = count_ours(dump, preset) - ours
            copies = 2 * kw["vocab_size"] * C
            print(f"{preset}: MTP module ours {mtp}, transformers' layer + norms + eh_proj {want}"
                  f" ({mtp + copies} with V3's copies of the embedding and head; the whole "
                  f"checkpoint {ours + mtp + copies})")
            if mtp != want:
                problems.append(f"{preset}: MTP module {mtp} != {want}")
    return problems


def main():
    dump, workdir = sys.argv[1:3]
    torch.manual_seed(0)
    only = sys.argv[3:]
    problems = []
    for name, (sets, batch, seq) in CASES.items():
        if not only or name in only:
            problems += run_case(dump, workdir, name, sets, batch, seq)
    if not only:
        problems += check_counts(dump)
    if problems:
        print("\n".join(problems))
        return 1
    print("deepseek parity: all cases agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
