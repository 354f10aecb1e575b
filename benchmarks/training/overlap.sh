#!/usr/bin/env bash
# What overlapping the gradient all-reduce with backward saves: the same short 2-rank tiny
# run with parallel.overlap true and false (small buckets, parallel.bucket_mb, so several
# all-reduces start during backward), alternating, REPETITIONS times each. Reads the
# "phases" records of metrics.jsonl (rank 0, ms per step, averaged over the run's last
# steps) and prints the medians: exposed communication (time the step waits for
# all-reduces after backward) and the whole step.
# usage: benchmarks/training/overlap.sh [BUILD_DIR] [REPETITIONS] [BUCKET_MB]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
reps=${2:-5}
bucket=${3:-1}
# The work directory (DSTRAIN_BENCH_WORK, or a temporary one) and the environment.
source "$here/bench_env.sh"
python3 "$src/tests/e2e/training/synthetic_language.py" generate "$work/data" --seq-len 256 \
  --train-samples 256 --valid-samples 2 >/dev/null
# 20 steps logged every 2: the phases record at step 20 averages steps 11-20 (warm).
for ((i = 1; i <= reps; i++)); do
  for overlap in true false; do
    out="$work/overlap-$overlap-$i"
    rm -rf "$out"
    mpiexec --oversubscribe -n 2 "$build/bin/dstrain" train "$src/inputs/tiny.yaml" \
      --set "data.train=$work/data/train.txt" --set "data.valid=$work/data/valid.txt" \
      --set data.text_separator= --set data.seq_len=256 --set training.micro_batch_size=8 \
      --set training.global_batch_size=16 --set training.max_steps=20 \
      --set training.schedule.warmup_steps=2 --set logging.every_steps=2 \
      --set eval.every_steps=0 --set eval.batches=1 --set debug.consistency_every=0 \
      --set "parallel.bucket_mb=$bucket" --set "parallel.overlap=$overlap" \
      --set "run.output_dir=$out" >/dev/null
  done
done
python3 - "$work" "$reps" "$bucket" <<'PY'
import glob, json, statistics, sys
work, reps, bucket = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"tiny, 2 ranks, micro-batch 8 x 256, bucket_mb {bucket}; medians of {reps} runs "
      "(ms per step, rank 0, steps 11-20)")
print("| parallel.overlap | exposed comm | backward | step | tokens/s |")
print("|---|---:|---:|---:|---:|")
res = {}
for overlap in ("true", "false"):
    ph, tps = [], []
    for path in glob.glob(f"{work}/overlap-{overlap}-*/metrics.jsonl"):
        recs = [json.loads(x) for x in open(path) if x.strip()]
        ph.append([r for r in recs if r["type"] == "phases"][-1])
        tps.append(statistics.median(r["tokens_per_s"] for r in recs
                                     if r["type"] == "step" and r["step"] > 10))
    m = {k: statistics.median(p[k] for p in ph) for k in ("comm_exposed_ms", "backward_ms", "step_ms")}
    m["tps"] = statistics.median(tps)
    m["all"] = sorted(round(p["comm_exposed_ms"], 1) for p in ph)
    res[overlap] = m
    print(f"| {overlap} | {m['comm_exposed_ms']:.1f} | {m['backward_ms']:.1f} | "
          f"{m['step_ms']:.1f} | {m['tps']:.0f} |")
for overlap, m in res.items():
    print(f"exposed comm, overlap {overlap}: {m['all']} ms")
on, off = res["true"]["comm_exposed_ms"], res["false"]["comm_exposed_ms"]
print(f"overlap: exposed communication {on:.1f} ms/step with overlap vs {off:.1f} without "
      f"({'lower' if on < off else 'NOT lower'})")
PY
