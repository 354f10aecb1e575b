#!/usr/bin/env python3
"""Oracle: the dense model against Hugging Face transformers' LlamaForCausalLM (code none
of us wrote), built from the same config and loaded with our exact initial weights.

For each case, model_dump writes our initial weights, a fixed batch, our logits, loss and
every parameter gradient (HDF5, read with h5py); transformers recomputes them in fp32 and
every comparison must hold:
  loss:   relative error <= 1e-5 (a scalar mean over tokens)
  logits: relative L2 error <= 1e-4
  grads:  relative L2 error <= 1e-4 for every parameter tensor
The 1e-4 bound is fp32 arithmetic (eps 6e-8) accumulated over reductions of up to a few
thousand terms in different orders (OpenBLAS vs PyTorch's kernels), with margin.

Then the parameter counts of the 7B and 67B presets: our layout pass against
transformers' count of the same config built on the meta device (nothing allocated).

usage: llama_parity.py MODEL_DUMP WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

TOL_REL_L2 = 1e-4
TOL_LOSS = 1e-5

CASES = {
    # name: (overrides, batch, seq)
    "mha": (["model.vocab_size=61", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
             "model.n_kv_heads=4", "model.ffn_dim=48", "model.max_seq_len=32"], 2, 16),
    "gqa_theta": (["model.vocab_size=67", "model.d_model=48", "model.n_layers=3",
                   "model.n_heads=6", "model.n_kv_heads=2", "model.ffn_dim=72",
                   "model.max_seq_len=32", "model.rope_theta=500000",
                   "model.norm_eps=1.0e-5"], 3, 12),
    "tied": (["model.vocab_size=50", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
              "model.n_kv_heads=1", "model.ffn_dim=40", "model.max_seq_len=16",
              "model.tie_embeddings=true"], 2, 9),
    "tiny_preset": (["model.preset=tiny", "model.n_layers=2"], 2, 64),
    # Three 64-row query blocks, the last one partial, with grouped key/value heads: the
    # host runs attention one (sequence, head) at a time over the blocks.
    "gqa_blocks": (["model.vocab_size=71", "model.d_model=48", "model.n_layers=2",
                    "model.n_heads=6", "model.n_kv_heads=2", "model.ffn_dim=64",
                    "model.max_seq_len=160"], 3, 150),
}

PRESETS = {
    "deepseek-llm-7b": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008,
                            num_hidden_layers=30, num_attention_heads=32,
                            num_key_value_heads=32),
    "deepseek-llm-67b": dict(vocab_size=102400, hidden_size=8192, intermediate_size=22016,
                             num_hidden_layers=95, num_attention_heads=64,
                             num_key_value_heads=8),
}


def rel_l2(ours, ref):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))


def hf_config(attrs):
    return LlamaConfig(
        vocab_size=int(attrs["vocab_size"]), hidden_size=int(attrs["d_model"]),
        intermediate_size=int(attrs["ffn_dim"]), num_hidden_layers=int(attrs["n_layers"]),
        num_attention_heads=int(attrs["n_heads"]),
        num_key_value_heads=int(attrs["n_kv_heads"]),
        max_position_embeddings=int(attrs["max_seq_len"]), rms_norm_eps=float(attrs["norm_eps"]),
        rope_theta=float(attrs["rope_theta"]), tie_word_embeddings=bool(attrs["tie_embeddings"]),
        hidden_act="silu", attention_bias=False, mlp_bias=False, torch_dtype=torch.float32,
        attn_implementation="eager")


def run_case(dump, workdir, name, sets, batch, seq):
    path = os.path.join(workdir, f"parity-{name}.h5")
    cmd = [dump, path, "--batch", str(batch), "--seq", str(seq)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True)
    problems = []
    with h5py.File(path, "r") as f:
        attrs = dict(f.attrs)
        cfg = hf_config(attrs)
        model = LlamaForCausalLM(cfg).float()
        state = {k: torch.from_numpy(np.array(f["params"][k])) for k in f["params"]}
        if cfg.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if "rotary" not in m]
        if missing or unexpected:
            problems.append(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        tokens = torch.from_numpy(np.array(f["tokens"])).long()
        targets = torch.from_numpy(np.array(f["targets"])).long()
        out = model(input_ids=tokens)
        logits = out.logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        loss.backward()
        ours_loss = float(attrs["loss"])
        err = abs(ours_loss - loss.item()) / abs(loss.item())
        if err > TOL_LOSS:
            problems.append(f"loss {ours_loss!r} vs {loss.item()!r} (rel {err:.2e})")
        err = rel_l2(np.array(f["logits"]), logits.detach().numpy())
        if err > TOL_REL_L2:
            problems.append(f"logits rel L2 {err:.2e}")
        params = dict(model.named_parameters())
        worst = ("", 0.0)
        for k in f["grads"]:
            ref = params[k].grad
            if ref is None:
                problems.append(f"{k}: no reference gradient")
                continue
            err = rel_l2(np.array(f["grads"][k]), ref.numpy())
            worst = max(worst, (k, err), key=lambda t: t[1])
            if err > TOL_REL_L2:
                problems.append(f"grad {k}: rel L2 {err:.2e}")
        n_grads = len(f["grads"])
    print(f"{name}: loss {ours_loss:.6f} (ref {loss.item():.6f}), {n_grads} gradients, "
          f"worst {worst[0]} rel L2 {worst[1]:.2e}")
    return [f"{name}: {p}" for p in problems]


def check_counts(dump):
    problems = []
    for preset, kw in PRESETS.items():
        ours = int(subprocess.run([dump, "--count", "--set", f"model.preset={preset}"],
                                  check=True, capture_output=True, text=True).stdout)
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **kw))
        ref = sum(p.numel() for p in model.parameters())
        print(f"{preset}: parameters ours {ours}, transformers {ref}")
        if ours != ref:
            problems.append(f"{preset}: parameter count {ours} != transformers {ref}")
    return problems


def main():
    dump, workdir = sys.argv[1:3]
    torch.manual_seed(0)
    problems = []
    for name, (sets, batch, seq) in CASES.items():
        problems += run_case(dump, workdir, name, sets, batch, seq)
    problems += check_counts(dump)
    if problems:
        print("\n".join(problems))
        return 1
    print("llama parity: all cases agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
