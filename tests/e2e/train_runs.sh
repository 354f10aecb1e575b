#!/usr/bin/env bash
# End-to-end training checks on a small slice of the demo corpus, launched as users do.
#   train_runs.sh MODE DSTRAIN SOURCE_DIR WORK_DIR
# MODE: smoke | determinism | nan-abort | nan-skip | straggler
set -euo pipefail
mode=$1 dstrain=$2 src=$3 work=$4
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
launch=(mpiexec -n 2 --oversubscribe)
common=(--set "data.train=$work/data/fortunes-train.txt" --set "data.valid=$work/data/fortunes-valid.txt"
        --set data.seq_len=64 --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.max_steps=4 --set training.schedule.warmup_steps=2 --set logging.every_steps=1
        --set eval.batches=2)
run() {  # run NAME [extra args]: trains into $work/NAME
  local name=$1; shift
  rm -rf "${work:?}/$name"
  "${launch[@]}" "$dstrain" train "$src/inputs/tiny.yaml" "${common[@]}" \
    --set "run.output_dir=$work/$name" "$@"
}
losses() { grep '"type":"step"' "$work/$1/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
case "$mode" in
  smoke)
    run smoke
    test -s "$work/smoke/deck.yaml"
    grep -q '"type":"header"' "$work/smoke/metrics.jsonl"
    [[ $(grep -c '"type":"step"' "$work/smoke/metrics.jsonl") -eq 4 ]]
    grep '"type":"phases"' "$work/smoke/metrics.jsonl" | grep -q '"slowest_rank":[01],'
    echo "train smoke: ok" ;;
  determinism)
    run a >/dev/null
    run b >/dev/null
    run c --set run.seed=99 >/dev/null
    [[ "$(losses a)" == "$(losses b)" ]] || { echo "same deck, different losses:"; paste <(losses a) <(losses b); exit 1; }
    [[ "$(losses a)" != "$(losses c)" ]] || { echo "a different seed gave the same losses"; exit 1; }
    echo "determinism: identical loss sequences for the same deck: $(losses a | tr '\n' ' ')" ;;
  nan-abort)
    run nan --set debug.inject_nan_step=2 ;;
  nan-skip)
    run skip --set debug.inject_nan_step=2 --set debug.nan_policy=skip ;;
  straggler)
    # Rank 1 sleeps 300 ms a step (its data phase); a step's own work here is a few ms, so
    # every phases record must name rank 1 the slowest, by 200-400 ms, step by step too,
    # and put 200-400 ms of rank 0's exposed communication down to waiting for it.
    run straggler --set training.max_steps=6 --set logging.every_steps=1 \
      --set debug.inject_straggler_rank=1 --set debug.inject_straggler_ms=300
    records=$(grep '"type":"phases"' "$work/straggler/metrics.jsonl")
    [[ $(wc -l <<<"$records") -eq 2 ]] || { echo "expected 2 phases records (steps 5, 6):"; echo "$records"; exit 1; }
    while read -r rec; do
      field() { grep -o "\"$1\":[^,}]*" <<<"$rec" | cut -d: -f2; }
      awk -v r="$(field slowest_rank)" -v lo="$(field work_ms_min)" -v hi="$(field work_ms_max)" \
        -v s="$(field straggle_ms)" -v w="$(field comm_peer_wait_ms)" -v c="$(field comm_exposed_ms)" \
        'BEGIN { d = hi - lo; if (r != 1 || d < 200 || d > 400 || s < 200 || s > 400 ||
                 w < 200 || w > 400 || w > c) exit 1 }' ||
        { echo "phases record does not name rank 1 as 200-400 ms slower, or does not put" \
               "200-400 ms of rank 0's exposed communication down to it: $rec"; exit 1; }
    done <<<"$records"
    echo "straggler: every phases record names rank 1 and rank 0's wait for it" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
