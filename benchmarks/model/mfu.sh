#!/usr/bin/env bash
# MFU of one forward + backward on one core: median model GFLOP/s of each model case
# divided by the median single-thread SGEMM GFLOP/s at 2048^3 (the CPU peak definition).
# usage: benchmarks/model/mfu.sh [BUILD_DIR] [REPETITIONS]
set -euo pipefail
build=${1:-build/cpu-release}
reps=${2:-5}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OPENBLAS_NUM_THREADS=1 "$build/benchmarks/model/model_benchmark" \
  --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
  --benchmark_filter='BM_sgemm_peak/2048|BM_forward_backward' \
  --benchmark_format=json > "$out"
python3 - "$out" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
med = {r["run_name"]: r for r in runs if r.get("aggregate_name") == "median"}
peak = med["BM_sgemm_peak/2048/real_time"]["GFLOPs"]
print(f"peak (median single-thread SGEMM 2048^3): {peak:.2f} GFLOP/s")
for name, r in med.items():
    if "forward_backward" in name:
        g = r["GFLOPs"]
        print(f"{name:45s} {g:8.2f} GFLOP/s {r['tokens_per_s']:10.0f} tokens/s  MFU {100 * g / peak:.1f}%")
PY
