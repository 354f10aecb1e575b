#!/usr/bin/env python3
"""Oracle: `dstrain export` against code none of us wrote (Hugging Face safetensors and
transformers).

For each case, ckpt_tool saves a checkpoint of initialised parameters through the
checkpoint library (as training saves them) and `dstrain export` writes the directory.
Then:
  safetensors: the file's layout follows the format (8-byte little-endian header length,
      JSON header padded with spaces to an 8-byte boundary, __metadata__.format == "pt"),
      and Python's `safetensors` loads exactly the parameters the checkpoint holds (f32:
      bit for bit against h5py's read of /params; bf16: bit for bit against torch's
      round-to-nearest-even conversion of them); no optimizer moments;
  config.json: AutoConfig loads it and every field matches the stored deck (Llama, or
      DeepseekV3/V2 with the latent-attention and MoE fields);
  logits: AutoModelForCausalLM.from_pretrained(dir) in fp32 on a fixed batch, against
      ours from LanguageModel::forward and from the KV-cache decoder (ckpt_tool logits):
      max |ours - ref| / max |ref| <= 1e-4. fp32 (eps 6e-8) through a few layers of
      reductions of up to a few hundred terms summed in different orders (OpenBLAS vs
      PyTorch), with margin: the figure measured is ~1e-6.
  tokenizer.json: when the run had one, the exported file is the stored text and
      `tokenizers` loads it.

usage: export_parity.py DSTRAIN CKPT_TOOL WORKDIR TOKENIZER_JSON
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file
from transformers import AutoConfig, AutoModelForCausalLM

TOL = 1e-4

# name: (model overrides, extra ckpt_tool args, batch, seq)
CASES = {
    "gqa_byte": (["model.vocab_size=260", "model.d_model=64", "model.n_layers=2",
                  "model.n_heads=4", "model.n_kv_heads=2", "model.ffn_dim=96",
                  "model.max_seq_len=32", "model.rope_theta=500000", "model.norm_eps=1.0e-5"],
                 ["--tokenizer-name", "byte260"], 2, 24),
    "mha_tied_bpe": (["model.vocab_size=640", "model.d_model=48", "model.n_layers=3",
                      "model.n_heads=3", "model.n_kv_heads=3", "model.ffn_dim=80",
                      "model.max_seq_len=20", "model.tie_embeddings=true"],
                     ["--tokenizer-name", "bpe-tiny", "--tokenizer-json", "@TOKENIZER@"], 3, 20),
    # DeepSeek-V3: latent attention with a query latent, DeepSeekMoE (sigmoid
    # router, 4 groups of 2 experts, top-3 of 2 groups, shared experts) after a dense block:
    # DeepseekV3ForCausalLM loads the per-expert tensors (fusing them) and the correction
    # bias. The KV-cache decoder runs it with its latent cache (absorbed products). YaRN
    # (rope_scaling) exported and applied by transformers from config.json.
    "deepseek_v3_moe": (["model.vocab_size=260", "model.d_model=64", "model.n_layers=3",
                         "model.n_heads=4", "model.n_kv_heads=4", "model.ffn_dim=96",
                         "model.max_seq_len=32", "model.q_lora_rank=24", "model.kv_lora_rank=16",
                         "model.qk_nope_head_dim=12", "model.qk_rope_head_dim=8",
                         "model.v_head_dim=10", "model.n_routed_experts=8",
                         "model.n_shared_experts=1", "model.num_experts_per_tok=3",
                         "model.moe_intermediate_size=24", "model.first_k_dense_replace=1",
                         "model.n_group=4", "model.topk_group=2",
                         "model.routed_scaling_factor=2.5", "model.rope_scaling.type=yarn",
                         "model.rope_scaling.factor=4",
                         "model.rope_scaling.original_max_seq_len=16",
                         "model.rope_scaling.mscale_all_dim=1"],
                        ["--tokenizer-name", "byte260"], 2, 24),
    # DeepSeek-V3 with its multi-token prediction module (model.mtp_depth 1): exported as
    # V3's checkpoints store layer n_layers (its own tensors plus copies of the embedding
    # and the head, config num_nextn_predict_layers 1); transformers loads the model and
    # leaves the module unread, and the logits are the main model's.
    "deepseek_v3_mtp": (["model.vocab_size=260", "model.d_model=64", "model.n_layers=2",
                         "model.n_heads=4", "model.n_kv_heads=4", "model.ffn_dim=96",
                         "model.max_seq_len=32", "model.kv_lora_rank=16",
                         "model.qk_nope_head_dim=12", "model.qk_rope_head_dim=8",
                         "model.v_head_dim=10", "model.n_routed_experts=8",
                         "model.n_shared_experts=1", "model.num_experts_per_tok=2",
                         "model.moe_intermediate_size=24", "model.first_k_dense_replace=1",
                         "model.mtp_depth=1"],
                        ["--tokenizer-name", "byte260"], 2, 24),
    # DeepSeek-V2's softmax router: DeepseekV2ForCausalLM.
    "deepseek_v2_moe": (["model.vocab_size=260", "model.d_model=64", "model.n_layers=2",
                         "model.n_heads=4", "model.n_kv_heads=4", "model.ffn_dim=96",
                         "model.max_seq_len=32", "model.kv_lora_rank=16",
                         "model.qk_nope_head_dim=12", "model.qk_rope_head_dim=8",
                         "model.v_head_dim=10", "model.n_routed_experts=6",
                         "model.n_shared_experts=2", "model.num_experts_per_tok=2",
                         "model.moe_intermediate_size=24", "model.first_k_dense_replace=1",
                         "model.norm_topk_prob=false", "model.moe.score=softmax"],
                        ["--tokenizer-name", "byte260"], 2, 24),
}


def max_rel(ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(ours - ref)) / max(np.max(np.abs(ref)), 1e-30))


def check_layout(path):
    """The byte layout of the format, read by hand."""
    problems = []
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    if (8 + n) % 8 != 0:
        problems.append(f"header length {n}: data does not start 8-byte aligned")
    text = raw[8:8 + n].decode("utf-8")
    if text.rstrip(" ") != text.rstrip() or not text.rstrip(" ").endswith("}"):
        problems.append("header padding is not trailing spaces")
    header = json.loads(text)
    if header.get("__metadata__", {}).get("format") != "pt":
        problems.append(f"__metadata__ {header.get('__metadata__')} lacks format pt")
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    at = 0
    for b, e in spans:
        if b != at:
            problems.append(f"byte buffer has a hole or overlap at {b} (expected {at})")
        at = e
    if at != len(raw) - 8 - n:
        problems.append(f"tensors cover {at} of {len(raw) - 8 - n} buffer bytes")
    return problems


def run_case(dstrain, tool, workdir, tokenizer, name, sets, extra, batch, seq):
    problems = []
    work = os.path.join(workdir, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    args = [tool, "make", os.path.join(work, "ckpt"), "--scale", "10"]
    args += [tokenizer if a == "@TOKENIZER@" else a for a in extra]
    for s in sets:
        args += ["--set", s]
    ckpt = subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()
    out32, out16 = os.path.join(work, "hf"), os.path.join(work, "hf-bf16")
    for out, dtype in ((out32, "f32"), (out16, "bf16")):
        r = subprocess.run([dstrain, "export", ckpt, "--format", "safetensors", "--out", out,
                            "--dtype", dtype], capture_output=True, text=True)
        print(r.stdout, end="")
        if r.returncode != 0:
            return [f"{name}: export --dtype {dtype} failed ({r.returncode}): {r.stderr}"]
    prefix = os.path.join(work, "ours")
    subprocess.run([tool, "logits", ckpt, prefix, "--batch", str(batch), "--seq", str(seq)],
                   check=True)

    st32 = os.path.join(out32, "model.safetensors")
    problems += check_layout(st32)
    problems += check_layout(os.path.join(out16, "model.safetensors"))
    with safe_open(st32, framework="pt") as f:
        if f.metadata().get("format") != "pt":
            problems.append(f"safetensors metadata {f.metadata()}")
    exported = load_file(st32)
    exported16 = {}
    with safe_open(os.path.join(out16, "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            exported16[k] = f.get_tensor(k)
    with h5py.File(ckpt, "r") as h:
        stored = {k: np.array(h["params"][k]) for k in h["params"]}
    deck_sets = dict(x.split("=", 1) for x in sets)
    if deck_sets.get("model.mtp_depth", "0") == "1":
        # V3's layout of the MTP layer: copies of the shared embedding and head.
        mtp = f"model.layers.{deck_sets['model.n_layers']}."
        for copy, of in ((mtp + "embed_tokens.weight", "model.embed_tokens.weight"),
                         (mtp + "shared_head.head.weight", "lm_head.weight")):
            if copy not in exported or not np.array_equal(exported[copy], stored[of]):
                problems.append(f"{copy}: not exported as a copy of {of}")
            stored[copy] = stored[of]
        if not any(k.startswith(mtp + "eh_proj") for k in exported):
            problems.append("the MTP module's eh_proj is not exported")
    if sorted(exported) != sorted(stored):
        problems.append(f"tensor names differ: exported {sorted(exported)} vs {sorted(stored)}")
    for k, v in stored.items():
        e = exported.get(k)
        if e is None:
            continue
        if e.dtype != np.float32 or e.shape != v.shape or not np.array_equal(e, v):
            problems.append(f"{k}: f32 export differs from the checkpoint")
        want16 = torch.from_numpy(v).to(torch.bfloat16)
        got16 = exported16.get(k)
        if got16 is None or got16.dtype != torch.bfloat16 or not torch.equal(got16, want16):
            problems.append(f"{k}: bf16 export is not the round-to-nearest-even of the f32 value")

    # config.json against the stored deck.
    cfg = AutoConfig.from_pretrained(out32)
    deck = {s.split("=")[0].split(".", 1)[1]: s.split("=")[1] for s in sets}
    deepseek = "kv_lora_rank" in deck
    want = {"vocab_size": int(deck["vocab_size"]), "hidden_size": int(deck["d_model"]),
            "num_hidden_layers": int(deck["n_layers"]),
            "num_attention_heads": int(deck["n_heads"]),
            "num_key_value_heads": int(deck["n_kv_heads"]),
            "intermediate_size": int(deck["ffn_dim"]),
            "max_position_embeddings": int(deck["max_seq_len"]),
            "head_dim": int(deck["d_model"]) // int(deck["n_heads"]),
            "tie_word_embeddings": deck.get("tie_embeddings", "false") == "true",
            "rms_norm_eps": float(deck.get("norm_eps", "1.0e-6")), "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "model_type": "llama"}
    if deepseek:
        v2 = deck.get("moe.score") == "softmax"
        for k in ("mlp_bias", "model_type", "head_dim"):
            want.pop(k)
        want["model_type"] = "deepseek_v2" if v2 else "deepseek_v3"
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                  "moe_intermediate_size", "first_k_dense_replace"):
            want[k] = int(deck[k])
        want["q_lora_rank"] = int(deck["q_lora_rank"]) if "q_lora_rank" in deck else None
        want["n_group"] = int(deck.get("n_group", "1"))
        want["topk_group"] = int(deck.get("topk_group", "1"))
        want["routed_scaling_factor"] = float(deck.get("routed_scaling_factor", "1.0"))
        if not v2:
            want["rope_interleave"] = True
            want["num_nextn_predict_layers"] = int(deck.get("mtp_depth", "0"))
            want["norm_topk_prob"] = deck.get("norm_topk_prob", "true") == "true"
    arch = ("DeepseekV2ForCausalLM" if want["model_type"] == "deepseek_v2" else
            "DeepseekV3ForCausalLM") if deepseek else "LlamaForCausalLM"
    for k, v in want.items():
        if getattr(cfg, k) != v:
            problems.append(f"config.json {k}: {getattr(cfg, k)!r}, deck says {v!r}")
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta != float(deck.get("rope_theta", "10000")):
        problems.append(f"config.json rope theta {theta}, deck says {deck.get('rope_theta')}")
    # YaRN (rope_scaling): transformers' rope parameters as the deck's.
    if deck.get("rope_scaling.type", "none") == "yarn":
        got = {k: rope.get(k) for k in ("rope_type", "factor", "original_max_position_embeddings",
                                        "mscale_all_dim")}
        exp = {"rope_type": "yarn", "factor": float(deck["rope_scaling.factor"]),
               "original_max_position_embeddings": int(deck["rope_scaling.original_max_seq_len"]),
               "mscale_all_dim": float(deck["rope_scaling.mscale_all_dim"])}
        if got != exp:
            problems.append(f"config.json rope parameters {got}, deck says {exp}")
    elif rope.get("rope_type", "default") != "default":
        problems.append(f"config.json rope type {rope.get('rope_type')}, the deck has none")
    if cfg.architectures != [arch]:
        problems.append(f"architectures {cfg.architectures}")

    # Logits: transformers on the exported directory against ours.
    model = AutoModelForCausalLM.from_pretrained(out32, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    V = cfg.vocab_size
    tokens = np.fromfile(prefix + ".tokens.i32", dtype=np.int32).reshape(batch, seq)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
    ours = np.fromfile(prefix + ".model.f32", dtype=np.float32).reshape(batch, seq, V)
    e_model = max_rel(ours, ref)
    dec = np.fromfile(prefix + ".decoder.f32", dtype=np.float32).reshape(batch, seq, V)
    e_dec = max_rel(dec, ref)
    dec_text = f"{'latent ' if deepseek else ''}KV-cache decoder {e_dec:.2e}"
    print(f"{name}: logits max rel diff vs transformers: LanguageModel {e_model:.2e}, "
          f"{dec_text} (max |logit| {np.max(np.abs(ref)):.2f})")
    if e_model > TOL:
        problems.append(f"LanguageModel logits max rel diff {e_model:.2e} > {TOL}")
    if e_dec > TOL:
        problems.append(f"decoder logits max rel diff {e_dec:.2e} > {TOL}")
    if np.max(np.abs(ref)) < 0.5:
        problems.append("reference logits too small to be a meaningful comparison")

    # The bf16 export loads too (its logits only as close as bf16 weights allow).
    model16 = AutoModelForCausalLM.from_pretrained(out16, dtype=torch.float32)
    with torch.no_grad():
        ref16 = model16(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
    e16 = max_rel(ref16, ref)
    print(f"{name}: bf16 export logits max rel diff vs f32: {e16:.2e}")
    # bf16 keeps 8 bits: ~4e-3 per weight, a few layers deep. Not for MoE: rounded router
    # weights move some tokens' discrete expert choice, and their logits with it (the
    # tensors' bf16 conversion is checked bit for bit above).
    if e16 > 5e-2 and "n_routed_experts" not in deck:
        problems.append(f"bf16 export logits {e16:.2e} from the f32 ones")

    tok_out = os.path.join(out32, "tokenizer.json")
    if "--tokenizer-json" in extra:
        from tokenizers import Tokenizer
        if not os.path.exists(tok_out):
            problems.append("no tokenizer.json exported for a run that had one")
        else:
            with open(tokenizer, "rb") as a, open(tok_out, "rb") as b:
                if a.read() != b.read():
                    problems.append("tokenizer.json differs from the run's")
            Tokenizer.from_file(tok_out).encode("Hello, world")
        if cfg.eos_token_id is None:
            problems.append("config.json lacks eos_token_id for a BPE tokenizer with one")
    else:
        if os.path.exists(tok_out):
            problems.append("byte260 export wrote a tokenizer.json")
        if (cfg.bos_token_id, cfg.eos_token_id) != (256, 257):
            problems.append(f"byte260 bos/eos {cfg.bos_token_id}/{cfg.eos_token_id}")
    return [f"{name}: {p}" for p in problems]


def main():
    dstrain, tool, workdir, tokenizer = sys.argv[1:5]
    os.makedirs(workdir, exist_ok=True)
    problems = []
    for name, (sets, extra, batch, seq) in CASES.items():
        problems += run_case(dstrain, tool, workdir, tokenizer, name, sets, extra, batch, seq)
    if problems:
        print("\n".join(problems))
        return 1
    print("export parity: all cases agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
