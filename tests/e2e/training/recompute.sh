#!/usr/bin/env bash
# training.recompute end to end (docs/performance.md), 2 ranks, tiny at half width
# (tests/e2e/decks/narrow.yaml) on a slice of the demo corpus, launched as users do:
#   recompute.sh DSTRAIN SOURCE_DIR WORK_DIR [KEY=VALUE...] -- LAUNCHER...
# 6 steps at recompute none, selective and full (fp32 and bf16): every step's loss, learning
# rate and gradient norm (and a DeepSeekMoE model's balance loss and per-block loads and
# biases, a multi-token prediction module's loss) and the final parameters (h5diff, exact) are bit-identical to none's. KEY=VALUE:
# deck overrides for every run (a latent-attention MoE model).
set -euo pipefail
dstrain=$1 src=$2 work=$3
shift 3
overrides=()
while [[ $# -gt 0 && $1 != -- ]]; do
  overrides+=(--set "$1")
  shift
done
[[ ${1:-} == -- ]] && shift
launch=("$@")
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
common=(--set "data.train=$work/data/fortunes-train.txt" --set "data.valid=$work/data/fortunes-valid.txt"
        --set data.seq_len=64 --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.max_steps=6 --set training.schedule.warmup_steps=2 --set logging.every_steps=1
        --set eval.batches=2 --set eval.every_steps=3 --set checkpoint.resume=none)
fail() { echo "recompute: FAILED: $*"; exit 1; }
fields() {  # the deterministic fields of RUN's step and eval records
  python3 -c '
import json,sys
for line in open(sys.argv[1]):
    r=json.loads(line)
    if r["type"]=="step": print("step", r["step"], repr(r["loss"]), repr(r["lr"]), repr(r["grad_norm"]), r["tokens"],
                               repr(r.get("aux_loss")), repr(r.get("mtp_loss")), json.dumps(r.get("moe"), sort_keys=True))
    elif r["type"]=="eval": print("eval", r["step"], repr(r["val_loss"]), r["val_tokens"])
' "$work/$1/metrics.jsonl"
}
for precision in fp32 bf16; do
  for mode in none selective full; do
    name=$precision-$mode
    rm -rf "${work:?}/$name"
    "${launch[@]}" "$dstrain" train "$src/tests/e2e/decks/narrow.yaml" "${common[@]}" ${overrides[@]+"${overrides[@]}"} \
      --set "run.output_dir=$work/$name" --set training.precision=$precision \
      --set training.recompute=$mode >"$work/$name.log" 2>&1 ||
      { echo "run $name failed:"; tail -20 "$work/$name.log"; exit 1; }
    grep -q "recompute: $mode" "$work/$name/deck.yaml" || fail "$name: deck.yaml lacks recompute: $mode"
  done
  fields "$precision-none" > "$work/$precision-none.fields"
  [[ $(grep -c '^step' "$work/$precision-none.fields") == 6 ]] || fail "$precision-none: expected 6 steps"
  for mode in selective full; do
    fields "$precision-$mode" | diff "$work/$precision-none.fields" - ||
      fail "$precision: recompute $mode's losses differ from none's"
    h5diff "$work/$precision-none/final-params.h5" "$work/$precision-$mode/final-params.h5" >/dev/null ||
      fail "$precision: recompute $mode's final parameters differ from none's"
  done
done
echo "recompute: ok (selective and full bit-identical to none over 6 steps on 2 ranks, fp32 and bf16)"
