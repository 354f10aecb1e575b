#!/usr/bin/env bash
# The cross-rank parameter check, end to end at 2 ranks:
#   consistency.sh DSTRAIN DECK DATA_DIR WORK_DIR -- LAUNCHER...
# 1. debug.inject_divergence_rank=1 with debug.consistency_every=1: the job must end with
#    exit code 6 (diverged) and rank 0's one message naming step 1, the first tensor and
#    rank 1; no other rank reports it.
# 2. The same run without the injection must pass the check at every step.
set -uo pipefail
dstrain=$1 deck=$2 data=$3 work=$4
shift 4
[[ "${1:-}" == "--" ]] && shift
launch=("$@")
mkdir -p "$work"
common=(--set "data.train=$data/train.txt" --set "data.valid=$data/valid.txt"
        --set data.text_separator= --set data.seq_len=64 --set training.micro_batch_size=2
        --set training.global_batch_size=4 --set training.max_steps=3
        --set training.schedule.warmup_steps=1 --set logging.every_steps=1
        --set eval.every_steps=0 --set eval.batches=1 --set debug.consistency_every=1)
want="[rank 0] error: parameters differ between ranks at step 1: first tensor model.embed_tokens.weight differs from rank 0's on rank 1"
fail=0

out=$("${launch[@]}" "$dstrain" train "$deck" "${common[@]}" --set "run.output_dir=$work/diverged" \
        --set debug.inject_divergence_rank=1 2>&1)
rc=$?
echo "--- injected divergence on rank 1 (exit $rc) ---"
echo "$out"
if [[ $rc -ne 6 ]]; then echo "FAILED: injected divergence: exit code $rc, expected 6"; fail=1; fi
n=$(grep -cF "$want" <<<"$out")
if [[ $n -ne 1 ]]; then
  echo "FAILED: injected divergence: expected exactly one line '$want', found $n"; fail=1
fi
if grep -q "\[rank [1-9][0-9]*\] error" <<<"$out"; then
  echo "FAILED: injected divergence: a rank other than 0 reported an error"; fail=1
fi
if grep -q "^step +2/" <<<"$out"; then
  echo "FAILED: injected divergence: training went on past the failed check at step 1"; fail=1
fi

out=$("${launch[@]}" "$dstrain" train "$deck" "${common[@]}" --set "run.output_dir=$work/clean" 2>&1)
rc=$?
echo "--- no injection (exit $rc) ---"
echo "$out"
if [[ $rc -ne 0 ]]; then echo "FAILED: without injection: exit code $rc, expected 0"; fail=1; fi
if grep -q "parameters differ" <<<"$out"; then
  echo "FAILED: without injection the check reported a difference"; fail=1
fi

[[ $fail -eq 0 ]] && echo "consistency check: divergence on rank 1 caught at step 1, clean run passes"
exit $fail
