#!/usr/bin/env bash
# Where a training run's matrix-product time goes: a short one-rank dstrain run with every
# cblas_sgemm call timed (sgemm_shapes_preload, LD_PRELOAD), grouped by shape. Prints a
# Markdown table (calls, share of all product time, GFLOP/s reached inside the run) and
# the rate of the run's own start-up 2048^3 products (the MFU peak), so the two are from
# the same minutes. The run uses kernels.host_gemm blas: the preload sees only the BLAS's
# products, not those of dstrain's own kernels (which `auto` runs on AVX-512 CPUs).
# usage: benchmarks/blas/gemm_shapes.sh [BUILD_DIR] [PRESET] [STEPS] [SEQ] [MICRO] [ROWS]
#   defaults: build/cpu-release tiny 12 256 8 25
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
preset=${2:-tiny}
steps=${3:-12}
seq=${4:-256}
micro=${5:-8}
rows=${6:-25}
preload="$build/benchmarks/blas/libdst_sgemm_shapes_preload.so"
[[ -f $preload ]] || { echo "gemm_shapes: $preload not built" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_ess_singleton_isolated=1
python3 "$src/tests/e2e/training/synthetic_language.py" generate "$work/data" --seq-len "$seq" \
  --train-samples $((micro * (steps + 1))) --valid-samples 2 >/dev/null
DSTRAIN_SGEMM_SHAPES_OUT="$work/shapes" LD_PRELOAD="$(cd "$(dirname "$preload")" && pwd)/$(basename "$preload")" \
  "$build/bin/dstrain" train "$src/inputs/tiny.yaml" --set "model.preset=$preset" \
  --set "data.train=$work/data/train.txt" --set "data.valid=$work/data/valid.txt" \
  --set data.text_separator= --set "data.seq_len=$seq" --set "training.micro_batch_size=$micro" \
  --set "training.global_batch_size=$micro" --set "training.max_steps=$steps" \
  --set training.schedule.warmup_steps=1 --set logging.every_steps=1 --set eval.every_steps=0 \
  --set kernels.host_gemm=blas \
  --set eval.batches=1 --set debug.consistency_every=0 --set "run.output_dir=$work/run" \
  >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
python3 - "$work" "$preset" "$steps" "$seq" "$micro" "$rows" <<'PY'
import glob, sys
work, preset, steps, seq, micro, rows = sys.argv[1:7]
files = glob.glob(f"{work}/shapes.*")
if len(files) != 1:
    sys.exit(f"gemm_shapes: expected one record file, found {files}")
TRANS = {111: "N", 112: "T", 113: "C"}
recs = []
for line in open(files[0]):
    order, ta, tb, m, n, k, b0, start, calls, secs = line.split()
    m, n, k, calls, secs = int(m), int(n), int(k), int(calls), float(secs)
    recs.append(dict(op=TRANS[int(ta)] + TRANS[int(tb)], m=m, n=n, k=k, beta0=b0 == "1", start=start == "1",
                     calls=calls, secs=secs, flop=2.0 * m * n * k * calls))
# dstrain's start-up peak: the 2048^3 products before any other shape.
peak = [r for r in recs if r["start"]]
model = [r for r in recs if r not in peak]
total = sum(r["secs"] for r in model)
if not model or total <= 0:
    sys.exit("gemm_shapes: the run made no matrix products")
flop = sum(r["flop"] for r in model)
print(f"{preset}, 1 rank, micro-batch {micro} x {seq}, {steps} steps: {sum(r['calls'] for r in model)} "
      f"cblas_sgemm calls in {total:.2f} s, {flop / total / 1e9:.1f} GFLOP/s over all of them")
if peak:
    p = sum(r["flop"] for r in peak) / sum(r["secs"] for r in peak) / 1e9
    print(f"the run's start-up 2048^3 products (its MFU peak): {p:.1f} GFLOP/s")
print("| op (row-major) | M | N | K | beta 0 | calls | share of product time | GFLOP/s |")
print("|---|---:|---:|---:|---|---:|---:|---:|")
for r in sorted(model, key=lambda r: -r["secs"])[: int(rows)]:
    print(f"| {r['op']} | {r['m']} | {r['n']} | {r['k']} | {'yes' if r['beta0'] else 'no'} | "
          f"{r['calls']} | {100 * r['secs'] / total:.1f}% | {r['flop'] / r['secs'] / 1e9:.1f} |")
PY
