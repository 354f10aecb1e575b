#!/usr/bin/env bash
# nccl_comm_build.sh SOURCE BUILD [cmake args...]
# The NCCL communicator builds and links: configures SOURCE into BUILD with CUDA and NCCL
# on, builds comm_nccl_smoke (which compiles lib/comm/nccl_communicator.cpp into dst_comm
# and links NCCL and the static CUDA runtime), then checks that the program really calls
# into libnccl. Needs nvcc and NCCL, not a GPU. Prints NCCL LINK OK at the end.
set -euo pipefail
src=$1 build=$2
shift 2
"$src/tests/cmake/configure_and_build.sh" "$src" "$build" \
  -DDSTRAIN_ENABLE_CUDA=ON -DDSTRAIN_ENABLE_NCCL=ON -DDSTRAIN_ENABLE_TESTS=ON \
  -DDSTRAIN_ENABLE_BENCHMARKS=OFF "$@" --target comm_nccl_smoke
exe=$build/tests/mpi/comm/comm_nccl_smoke
calls=$(nm -D --undefined-only "$exe")
for sym in ncclCommInitRankConfig ncclCommGetAsyncError ncclCommAbort ncclAllReduce; do
  if ! grep -qw "$sym" <<<"$calls"; then
    echo "nccl_comm_build: $exe does not call $sym" >&2
    exit 1
  fi
done
echo "NCCL LINK OK"
