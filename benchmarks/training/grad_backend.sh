#!/usr/bin/env bash
# The gradient back end of ranks on one node: the same 2-rank run with parallel.backend
# shm (sums in shared memory, comm::SharedSum) and mpi (Open MPI's all-reduce),
# alternating, REPETITIONS times each. Reads the "phases" record of metrics.jsonl (rank 0,
# ms per step, averaged over the second half of the steps) and the logged tokens/s of
# those steps, and prints the medians of backward (which pays for the sums done by the
# progress thread on the same core), exposed communication and the whole step.
# usage: benchmarks/training/grad_backend.sh [BUILD_DIR] [REPETITIONS] [tiny|small] [STEPS]
#   tiny: micro-batch 8 x 256 per rank; small: 1 x 512 per rank (ddp_compare.sh's shapes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
reps=${2:-5}
preset=${3:-small}
steps=${4:-12}
case $preset in
  tiny) seq=256 micro=8 ;;
  small) seq=512 micro=1 ;;
  *) echo "grad_backend.sh: preset must be tiny or small, not '$preset'" >&2; exit 2 ;;
esac
if ((steps < 2 || steps % 2)); then
  echo "grad_backend.sh: STEPS must be even and at least 2" >&2
  exit 2
fi
# The work directory (DSTRAIN_BENCH_WORK, or a temporary one) and the environment.
source "$here/bench_env.sh"
python3 "$src/tests/e2e/training/synthetic_language.py" generate "$work/data" --seq-len "$seq" \
  --train-samples 256 --valid-samples 2 >/dev/null
# Logged every STEPS/2 steps: the last phases record averages the second half (warm).
for ((i = 1; i <= reps; i++)); do
  for backend in shm mpi; do
    out="$work/$backend-$i"
    rm -rf "$out"
    mpiexec --oversubscribe -n 2 "$build/bin/dstrain" train "$src/inputs/tiny.yaml" \
      --set "model.preset=$preset" \
      --set "data.train=$work/data/train.txt" --set "data.valid=$work/data/valid.txt" \
      --set data.text_separator= --set "data.seq_len=$seq" \
      --set "training.micro_batch_size=$micro" --set "training.global_batch_size=$((2 * micro))" \
      --set "training.max_steps=$steps" --set training.schedule.warmup_steps=1 \
      --set "logging.every_steps=$((steps / 2))" --set eval.every_steps=0 \
      --set eval.batches=1 --set debug.consistency_every=0 --set checkpoint.every_steps=0 \
      --set "parallel.backend=$backend" --set "run.output_dir=$out" >"$out.log" 2>&1 || {
      cat "$out.log" >&2
      echo "grad_backend.sh: the $backend run $i failed" >&2
      exit 1
    }
    grep -q "| comm $backend |" "$out.log" || {
      echo "grad_backend.sh: the $backend run did not use comm $backend" >&2
      exit 1
    }
  done
done
python3 - "$work" "$reps" "$preset" "$seq" "$micro" "$steps" <<'PY'
import glob, json, statistics, sys
work, reps, preset, seq, micro, steps = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
steps = int(steps)
print(f"{preset}, 2 ranks, micro-batch {micro} x {seq} per rank, {steps} steps; medians of "
      f"{reps} alternating runs (ms per step, rank 0, steps {steps // 2 + 1}-{steps})")
print("| parallel.backend | backward | exposed comm | step | tokens/s |")
print("|---|---:|---:|---:|---:|")
res = {}
for backend in ("shm", "mpi"):
    ph, tps = [], []
    for path in glob.glob(f"{work}/{backend}-*/metrics.jsonl"):
        recs = [json.loads(x) for x in open(path) if x.strip()]
        ph.append([r for r in recs if r["type"] == "phases"][-1])
        tps.append([r for r in recs if r["type"] == "step"][-1]["tokens_per_s"])
    m = {k: statistics.median(p[k] for p in ph)
         for k in ("backward_ms", "comm_exposed_ms", "step_ms")}
    m["tps"] = statistics.median(tps)
    m["steps"] = sorted(round(p["step_ms"], 1) for p in ph)
    res[backend] = m
    print(f"| {backend} | {m['backward_ms']:.1f} | {m['comm_exposed_ms']:.1f} | "
          f"{m['step_ms']:.1f} | {m['tps']:.0f} |")
for backend, m in res.items():
    print(f"step times, {backend}: {m['steps']} ms")
print(f"grad backend: shm/mpi tokens/s {res['shm']['tps'] / res['mpi']['tps']:.3f}, "
      f"backward {res['shm']['backward_ms']:.1f} vs {res['mpi']['backward_ms']:.1f} ms")
PY
