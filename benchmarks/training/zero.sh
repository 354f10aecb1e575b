#!/usr/bin/env bash
# ZeRO stages against each other (parallel.zero_stage, docs/performance.md "ZeRO"): the
# same 2-rank run at zero_stage 0, 1 and 2, the order of the three rotated and reversed
# from one repetition to the next (0 1 2, 2 1 0, 1 2 0, 0 2 1, ...: each stage first,
# middle and last alike), REPETITIONS times each, on the back end BACKEND (mpi or shm).
# Per run (logged every STEPS/2 steps, as grad_backend.sh): the tokens/s of the second
# half of the steps, the "phases" record (rank 0, ms per step over the run: exposed
# communication, which holds the parameters' all-gather at stages 1 and 2, and the
# optimizer), and the peak resident
# memory of rank 0 (peak_mem_bytes: no checkpoint in the runs, so nothing gathered).
# Prints the medians per stage and each stage's tokens/s against stage 0's.
# usage: benchmarks/training/zero.sh [BUILD_DIR] [REPETITIONS] [tiny|small] [STEPS] [mpi|shm]
#        [fp32|bf16|fp16] (training.precision; bf16/fp16 shard the fp32 master at stage >= 1)
#   tiny: micro-batch 8 x 256 per rank; small: 1 x 512 per rank (ddp_compare.sh's shapes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
reps=${2:-5}
preset=${3:-small}
steps=${4:-12}
backend=${5:-mpi}
precision=${6:-fp32}
case $preset in
  tiny) seq=256 micro=8 ;;
  small) seq=512 micro=1 ;;
  *) echo "zero.sh: preset must be tiny or small, not '$preset'" >&2; exit 2 ;;
esac
case $backend in
  mpi | shm) ;;
  *) echo "zero.sh: BACKEND must be mpi or shm, not '$backend'" >&2; exit 2 ;;
esac
case $precision in
  fp32 | bf16 | fp16) ;;
  *) echo "zero.sh: PRECISION must be fp32, bf16 or fp16, not '$precision'" >&2; exit 2 ;;
esac
if ((steps < 2 || steps % 2)); then
  echo "zero.sh: STEPS must be even and at least 2" >&2
  exit 2
fi
source "$here/bench_env.sh"
python3 "$src/tests/e2e/training/synthetic_language.py" generate "$work/data" --seq-len "$seq" \
  --train-samples 256 --valid-samples 2 >/dev/null
orders=("0 1 2" "2 1 0" "1 2 0" "0 2 1" "2 0 1" "1 0 2")
for ((i = 1; i <= reps; i++)); do
  for zero in ${orders[$(((i - 1) % 6))]}; do
    out="$work/zero$zero-$i"
    rm -rf "$out"
    mpiexec --oversubscribe -n 2 "$build/bin/dstrain" train "$src/inputs/tiny.yaml" \
      --set "model.preset=$preset" \
      --set "data.train=$work/data/train.txt" --set "data.valid=$work/data/valid.txt" \
      --set data.text_separator= --set "data.seq_len=$seq" \
      --set "training.micro_batch_size=$micro" --set "training.global_batch_size=$((2 * micro))" \
      --set "training.max_steps=$steps" --set training.schedule.warmup_steps=1 \
      --set "logging.every_steps=$((steps / 2))" \
      --set eval.every_steps=0 --set eval.batches=1 --set debug.consistency_every=0 \
      --set checkpoint.every_steps=0 --set checkpoint.keep_last=1 \
      --set "parallel.backend=$backend" --set "parallel.zero_stage=$zero" \
      --set "training.precision=$precision" \
      --set "run.output_dir=$out" >"$out.log" 2>&1 || {
      cat "$out.log" >&2
      echo "zero.sh: the zero_stage $zero run $i failed" >&2
      exit 1
    }
  done
done
python3 - "$work" "$reps" "$preset" "$seq" "$micro" "$steps" "$backend" "$precision" <<'PY'
import glob, json, statistics, sys
work, reps, preset, seq, micro, steps, backend, precision = (sys.argv[1], int(sys.argv[2]),
                                                             *sys.argv[3:])
steps = int(steps)
print(f"{preset} {precision}, 2 ranks ({backend}), micro-batch {micro} x {seq} per rank, {steps} steps; "
      f"medians of {reps} runs per stage, orders rotated (rank 0; tokens/s of steps "
      f"{steps // 2 + 1}-{steps})")
print("| zero_stage | tokens/s (runs) | vs stage 0 | exposed comm ms | optimizer ms | peak MB |")
print("|---|---|---:|---:|---:|---:|")
res = {}
for zero in ("0", "1", "2"):
    tps, comm, opt, peak = [], [], [], []
    for path in sorted(glob.glob(f"{work}/zero{zero}-*/metrics.jsonl")):
        recs = [json.loads(x) for x in open(path) if x.strip()]
        st = [r for r in recs if r["type"] == "step"]
        tps.append(st[-1]["tokens_per_s"])
        ph = [r for r in recs if r["type"] == "phases"][-1]
        comm.append(ph["comm_exposed_ms"])
        opt.append(ph["optimizer_ms"])
        peak.append(max(r["peak_mem_bytes"] for r in st) / 1e6)
    res[zero] = statistics.median(tps)
    runs = " ".join(f"{t:.0f}" for t in tps)
    print(f"| {zero} | {res[zero]:.0f} ({runs}) | {res[zero] / res['0']:.3f} | "
          f"{statistics.median(comm):.1f} | {statistics.median(opt):.1f} | "
          f"{statistics.median(peak):.1f} |")
print(f"zero stages: tokens/s stage 1 / 0 {res['1'] / res['0']:.3f}, stage 2 / 0 "
      f"{res['2'] / res['0']:.3f}")
PY
