#!/usr/bin/env bash
# configure_and_build.sh SOURCE BUILD [cmake args...] [--target T...]
# Configures SOURCE into BUILD with the given cache arguments and builds the targets;
# prints BUILD OK at the end so the CTest check can tell a finished build apart.
set -euo pipefail
src=$1 build=$2
shift 2
cache=() targets=()
while [[ $# -gt 0 ]]; do
  if [[ "$1" == "--target" ]]; then targets+=("$2"); shift 2; else cache+=("$1"); shift; fi
done
cmake -S "$src" -B "$build" -G Ninja "${cache[@]}"
if [[ ${#targets[@]} -gt 0 ]]; then cmake --build "$build" -j 2 --target "${targets[@]}"; else cmake --build "$build" -j 2; fi
echo "BUILD OK"
