#!/usr/bin/env bash
# Mixed precision end to end (docs/precision.md), 2 ranks, the tiny deck on a slice of the
# demo corpus, launched as users do.
#   precision.sh MODE DSTRAIN SOURCE_DIR WORK_DIR -- LAUNCHER...
# MODE tolerance: 20 steps in fp32, bf16 and fp16; every step's loss of bf16 and fp16
#   within 1e-2 nats of fp32's (measured: bf16 2.2e-3, fp16 3.4e-4 at most), bf16 not
#   identical to fp32 (the emulation is on), the loss scale logged only in fp16.
# MODE overflow: fp16 with debug.inject_overflow_step=2 (+inf in rank 1's gradient only):
#   the step is skipped on every rank, the logged scale goes 65536 -> 32768, the
#   checkpoints before and after the skipped step hold bit-identical parameters and
#   moments (and the same optimizer step count), training continues; then a stop at step
#   4 and a resume that restores the scale 32768 with its clean-step count.
set -euo pipefail
mode=$1 dstrain=$2 src=$3 work=$4
shift 4
[[ ${1:-} == -- ]] && shift
launch=("$@")
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
common=(--set "data.train=$work/data/fortunes-train.txt" --set "data.valid=$work/data/fortunes-valid.txt"
        --set data.seq_len=64 --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.schedule.warmup_steps=2 --set logging.every_steps=1 --set eval.batches=2
        --set eval.every_steps=0)
run() {  # run NAME [extra args]: trains into $work/NAME, log in $work/NAME.log
  local name=$1; shift
  "${launch[@]}" "$dstrain" train "$src/inputs/tiny.yaml" "${common[@]}" \
    --set "run.output_dir=$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { echo "run $name failed:"; tail -20 "$work/$name.log"; exit 1; }
}
fail() { echo "precision $mode: FAILED: $*"; exit 1; }
field() {  # field RUN KEY: that key of every step record, one per line ("-" if absent)
  grep '"type":"step"' "$work/$1/metrics.jsonl" |
    sed -e "s/.*\"$2\":\([^,}]*\).*/\1/" -e t -e 's/.*/-/'
}
case "$mode" in
  tolerance)
    for p in fp32 bf16 fp16; do
      rm -rf "${work:?}/$p"
      run "$p" --set training.max_steps=20 --set training.precision=$p
    done
    for p in bf16 fp16; do
      paste <(field fp32 loss) <(field $p loss) | awk -v p=$p '
        { d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d; if ($1 != $2) differ = 1; n++ }
        END { printf "%s: max |loss - fp32 loss| over %d steps = %.3g\n", p, n, max;
              if (n != 20) { print p ": expected 20 steps"; exit 1 }
              if (max > 1e-2) { print p ": beyond the 1e-2 tolerance"; exit 1 }
              if (p == "bf16" && !differ) { print "bf16: identical to fp32: no rounding happened"; exit 1 } }'
    done
    [[ $(field fp16 loss_scale | sort -u) == 65536.0 ]] || fail "fp16 loss_scale is not 65536 throughout"
    [[ $(field fp32 loss_scale | sort -u) == - ]] || fail "fp32 logs a loss scale"
    [[ $(field bf16 loss_scale | sort -u) == - ]] || fail "bf16 logs a loss scale"
    grep -q "step .*20/20 .*| scale 65536" "$work/fp16.log" || fail "no scale on fp16's step line"
    echo "precision tolerance: ok (bf16 and fp16 within 1e-2 of fp32 over 20 steps)" ;;
  overflow)
    rm -rf "${work:?}/ovf"
    args=(--set training.precision=fp16 --set training.max_steps=6 --set debug.inject_overflow_step=2
          --set checkpoint.every_steps=1 --set checkpoint.keep_last=10)
    run ovf "${args[@]}" --set training.stop_at_step=4
    log=$work/ovf.log ck=$work/ovf/checkpoints
    grep -q "\[rank 0\] warning: fp16 gradient overflow at step 3 (1 of 2 data ranks had a non-finite gradient): step skipped, loss scale 65536 -> 32768" "$log" ||
      fail "no overflow warning"
    ! grep -q "\[rank 1\] warning: fp16 gradient overflow" "$log" || fail "the warning is printed twice"
    grep -q "step .*3/6 .*| scale 65536 | SKIPPED (fp16 overflow, loss scale halved)" "$log" ||
      fail "step 3 not reported as skipped"
    [[ "$(field ovf loss_scale | tr '\n' ' ')" == "65536.0 65536.0 65536.0 32768.0 " ]] ||
      fail "loss scales $(field ovf loss_scale | tr '\n' ' ')"
    [[ "$(field ovf skipped | tr '\n' ' ')" == "false false true false " ]] || fail "skipped flags"
    # Every rank skipped: the parameters and moments after step 3 are those after step 2.
    h5diff -q "$ck/step-2.h5" "$ck/step-3.h5" /params /params || fail "parameters changed in the skipped step"
    h5diff -q "$ck/step-2.h5" "$ck/step-3.h5" /optimizer /optimizer || fail "moments changed in the skipped step"
    ! h5diff -q "$ck/step-3.h5" "$ck/step-4.h5" /params /params || fail "step 4 did not train"
    attr() { h5dump -a "/$2" "$ck/$1" | sed -n 's/^ *(0): //p'; }
    [[ $(attr step-3.h5 optimizer_steps) == 2 ]] || fail "optimizer step count after the skip: $(attr step-3.h5 optimizer_steps)"
    [[ $(attr step-3.h5 loss_scale) == 32768 ]] || fail "checkpointed scale $(attr step-3.h5 loss_scale)"
    [[ $(attr step-4.h5 loss_scale_clean_steps) == 1 ]] || fail "checkpointed clean steps"
    # Resume from step 4: the scale and its count come back.
    run ovf "${args[@]}"
    grep -q "resumed from .*step-4.h5 at step 4 .*; loss scale 32768 (1 clean steps)" "$work/ovf.log" ||
      fail "the resume did not restore the loss scale"
    grep -q "step .*5/6 .*| scale 32768" "$work/ovf.log" || fail "step 5 after the resume is not at scale 32768"
    grep -q "step .*6/6 .*| scale 32768" "$work/ovf.log" || fail "step 6 missing"
    echo "precision overflow: ok (skipped on every rank, scale 65536 -> 32768, parameters unchanged, scale restored on resume)" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
