#!/usr/bin/env bash
# The checkpoint tools end to end (docs/tools.md), on a checkpoint ckpt_tool saves.
#   tools_runs.sh MODE DSTRAIN CKPT_TOOL WORK_DIR [SOURCE_DIR]
# MODE: inspect | damaged | generate | generate-moe (checkpoints from ckpt_tool; the last a
# DeepSeek-V3-shaped model: latent attention with a query latent, DeepSeekMoE) | trained
# (a checkpoint from a 3-step `dstrain train` on the demo corpus; needs SOURCE_DIR)
set -euo pipefail
mode=$1 dstrain=$2 tool=$3 work=$4 src=${5:-}
rm -rf "$work"
mkdir -p "$work"
if [[ $mode != trained ]]; then
  # A small byte-level model (vocab 260), weights scaled so greedy decoding is not flat.
  model=(--set model.d_model=64 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
         --set model.ffn_dim=96 --set model.max_seq_len=48)
  if [[ $mode == generate-moe ]]; then
    model+=(--set model.n_layers=3 --set model.n_kv_heads=4 --set model.q_lora_rank=24
            --set model.kv_lora_rank=16 --set model.qk_nope_head_dim=12
            --set model.qk_rope_head_dim=8 --set model.v_head_dim=10
            --set model.n_routed_experts=8 --set model.n_shared_experts=1
            --set model.num_experts_per_tok=2 --set model.moe_intermediate_size=32
            --set model.first_k_dense_replace=1)
    mode=generate
  fi
  ckpt=$("$tool" make "$work/ckpt" --scale 10 "${model[@]}")
  test -f "$ckpt"
fi
case "$mode" in
  inspect)
    "$dstrain" inspect "$ckpt"
    # --no-verify skips the checksums but still lists the tensors.
    quick=$("$dstrain" inspect "$ckpt" --no-verify --no-deck)
    grep -q "status (not verified" <<<"$quick"
    echo "tools inspect: ok" ;;
  damaged)
    # Flip one byte in the middle of the file: the manifest's whole-file hash refuses it
    # before HDF5 reads it, and the exit code is the checkpoint one (8).
    size=$(stat -c %s "$ckpt")
    off=$((size / 2))
    byte=$(od -An -tu1 -j "$off" -N1 "$ckpt" | tr -d ' ')
    printf "$(printf '\\%03o' $((byte ^ 255)))" | dd of="$ckpt" bs=1 seek="$off" conv=notrunc status=none
    set +e
    "$dstrain" inspect "$ckpt"
    rc=$?
    set -e
    echo "exit $rc"
    [[ $rc -eq 8 ]] || { echo "expected exit 8 for a damaged checkpoint"; exit 1; }
    echo "tools damaged: ok" ;;
  generate)
    gen=("$dstrain" generate "$ckpt" --prompt "Once upon a time" --max-new-tokens 20 --ignore-eos)
    a=$("${gen[@]}" --json)
    b=$("${gen[@]}" --json)
    echo "$a"
    [[ "$a" == "$b" ]] || { echo "greedy decoding differs between two runs:"; echo "$b"; exit 1; }
    echo "greedy: identical text on two runs"
    # Plain output: the prompt, then its continuation.
    plain=$("${gen[@]}")
    grep -q "^Once upon a time" <<<"$plain"
    s=("$dstrain" generate "$ckpt" --prompt "Once" --max-new-tokens 16 --ignore-eos --json
       --temperature 0.8 --top-k 20 --top-p 0.9)
    s1=$("${s[@]}" --seed 7)
    s2=$("${s[@]}" --seed 7)
    [[ "$s1" == "$s2" ]] || { echo "sampling with one seed differs:"; echo "$s1"; echo "$s2"; exit 1; }
    echo "sampled: identical for one seed"
    # A 40-byte prompt in a 48-token context: 8 new tokens, then the context is full.
    "$dstrain" generate "$ckpt" --prompt "0123456789012345678901234567890123456789" \
      --max-new-tokens 100 --ignore-eos --json 2>&1 | tee "$work/full.txt"
    grep -q '"new_tokens":8' "$work/full.txt"
    echo "tools generate: ok" ;;
  trained)
    "$src/scripts/prepare-demo-data" "$work/data" >/dev/null
    "$dstrain" train "$src/inputs/tiny.yaml" --set "data.train=$work/data/fortunes-train.txt" \
      --set "data.valid=$work/data/fortunes-valid.txt" --set data.seq_len=64 \
      --set training.micro_batch_size=2 --set training.global_batch_size=4 \
      --set training.max_steps=3 --set checkpoint.every_steps=0 --set eval.batches=1 \
      --set "run.output_dir=$work/run" >/dev/null
    ckpt=$work/run/checkpoints/step-3.h5
    "$dstrain" inspect "$ckpt" >"$work/inspect.txt"
    head -20 "$work/inspect.txt"
    grep -Eq "^  step +3$" "$work/inspect.txt"
    grep -Eq "params/model.layers.3.mlp.down_proj.weight +\(256, 688\) +f32 +[0-9a-f]{16} OK" "$work/inspect.txt"
    grep -Eq "optimizer/exp_avg_sq/model.norm.weight" "$work/inspect.txt"
    grep -Eq "^  max_steps: 3$" "$work/inspect.txt"  # the deck
    "$dstrain" export "$ckpt" --out "$work/hf"
    test -s "$work/hf/model.safetensors"
    grep -q '"LlamaForCausalLM"' "$work/hf/config.json"
    gen=("$dstrain" generate "$ckpt" --prompt "The " --max-new-tokens 24 --ignore-eos --json)
    a=$("${gen[@]}")
    [[ "$a" == "$("${gen[@]}")" ]] || { echo "greedy decoding differs between two runs"; exit 1; }
    echo "$a"
    echo "tools on a trained checkpoint: ok" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
