#!/usr/bin/env bash
# What training.recompute costs in step time: the same short run at recompute none,
# selective and full, alternating, REPETITIONS times each, on RANKS ranks. Reads the step
# records of metrics.jsonl (rank 0, step_ms of the run's last STEPS-2 steps, their median)
# and prints the medians over the repetitions and the ratios to none. The model FLOPs do
# not change; full recomputes the blocks' forward (about +33% of the blocks' FLOPs, the
# plan's "recompute FLOPs"), selective the attention scores.
# usage: benchmarks/training/recompute_cost.sh [BUILD_DIR] [REPETITIONS] [RANKS] [PRESET]
#        [MICRO_BATCH] [SEQ_LEN] [STEPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
reps=${2:-3}
ranks=${3:-1}
preset=${4:-small}
micro=${5:-2}
seq=${6:-512}
steps=${7:-8}
source "$here/bench_env.sh"
python3 "$src/tests/e2e/training/synthetic_language.py" generate "$work/data" --seq-len "$seq" \
  --train-samples 256 --valid-samples 2 >/dev/null
for ((i = 1; i <= reps; i++)); do
  for mode in none selective full; do
    out="$work/recompute-$mode-$i"
    rm -rf "$out"
    mpiexec --oversubscribe -n "$ranks" "$build/bin/dstrain" train "$src/inputs/tiny.yaml" \
      --set "model.preset=$preset" \
      --set "data.train=$work/data/train.txt" --set "data.valid=$work/data/valid.txt" \
      --set data.text_separator= --set "data.seq_len=$seq" \
      --set "training.micro_batch_size=$micro" \
      --set "training.global_batch_size=$((micro * ranks))" --set "training.max_steps=$steps" \
      --set training.schedule.warmup_steps=2 --set logging.every_steps=1 \
      --set eval.every_steps=0 --set eval.batches=1 --set debug.consistency_every=0 \
      --set "training.recompute=$mode" --set "run.output_dir=$out" >/dev/null
  done
done
python3 - "$work" "$reps" "$ranks" "$preset" "$micro" "$seq" <<'PY'
import json, statistics, sys
work, reps, ranks, preset, micro, seq = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def run_median(mode, i):
    steps = [json.loads(l) for l in open(f"{work}/recompute-{mode}-{i}/metrics.jsonl")]
    ms = [r["step_ms"] for r in steps if r.get("type") == "step"][2:]
    peak = max(r["peak_mem_bytes"] for r in steps if r.get("type") == "step")
    return statistics.median(ms), peak
print(f"{preset}, {ranks} rank(s), micro-batch {micro} x {seq}; medians of {reps} runs "
      "(rank 0, step_ms of steps 3..)")
print("| training.recompute | step ms | runs' medians | ratio to none | peak RSS MiB |")
print("|---|---:|---|---:|---:|")
base = None
for mode in ("none", "selective", "full"):
    runs = [run_median(mode, i) for i in range(1, reps + 1)]
    med = statistics.median(r[0] for r in runs)
    base = base or med
    print(f"| {mode} | {med:.0f} | {', '.join(f'{r[0]:.0f}' for r in runs)} | "
          f"{med / base:.3f} | {max(r[1] for r in runs) / 2**20:.0f} |")
PY
