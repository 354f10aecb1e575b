#!/usr/bin/env bash
# dstrain against PyTorch DistributedDataParallel (gloo, 1 thread per process) on the same
# model shapes and batches, side by side in one run; prints a Markdown table (tokens/s,
# model GFLOP/s, MFU vs the SGEMM peak), dstrain/DDP at 2 ranks and 1->2 rank scaling.
# usage: benchmarks/training/ddp_compare.sh [BUILD_DIR] [REPETITIONS] [full|smoke]
#   full (default): tiny (seq 256 x 8 per rank) and small (seq 512 x 1 per rank), about
#   10 minutes at 3 repetitions on 2 cores; smoke: tiny at seq 64, 3 steps (CTest).
# Needs the oracle Python environment (scripts/setup-oracles: torch, transformers);
# DSTRAIN_PYTHON overrides it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
reps=${2:-3}
mode=${3:-full}
py=${DSTRAIN_PYTHON:-$("$src/scripts/setup-oracles")}
# The runs' directories (about 1 GiB: final parameters and checkpoints) go in
# DSTRAIN_BENCH_WORK, or a temporary one; the same environment for both sides.
source "$here/bench_env.sh"
"$py" "$here/ddp_compare.py" "$build/bin/dstrain" "$src" "$work" "$reps" "$mode" -- \
  mpiexec --oversubscribe -n
