#!/usr/bin/env bash
# Checkpoint throughput against plain sequential I/O (docs/checkpoint.md, "throughput"):
# 1 and 2 ranks, each MPI-IO setting below, REPETITIONS each; prints the median lines.
# usage: benchmarks/ckpt/run.sh [BUILD_DIR] [MB] [REPETITIONS] [WORK_DIR]
# WORK_DIR must be on the file system under test (default: a folder in the build dir).
set -euo pipefail
build=${1:-build/cpu-release}
mb=${2:-1024}
reps=${3:-3}
work=${4:-$build/ckpt-bench-work}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_btl_vader_single_copy_mechanism=none
bench=$build/benchmarks/ckpt/checkpoint_benchmark
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
run() {  # ranks io-component label args...
  local n=$1 io=$2 label=$3
  shift 3
  OMPI_MCA_io=$io mpiexec --oversubscribe -n "$n" "$bench" --dir "$work" --mb "$mb" \
    --reps "$reps" --label "$label" "$@" | grep '^median'
}
for n in 1 2; do
  run "$n" ompio "ompio, align 1 MiB"
  run "$n" ompio "ompio, no alignment" --alignment 1
  run "$n" romio321 "romio, align 1 MiB, cb_write enable, cb 16 MiB" \
    --hint romio_cb_write=enable --hint cb_buffer_size=16777216
  run "$n" romio321 "romio, align 1 MiB, cb_write disable" --hint romio_cb_write=disable
done
