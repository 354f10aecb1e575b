#!/usr/bin/env bash
# Data, tensor and pipeline parallelism on 2 ranks: the same global batch trained as
# DP=2 (parallel.backend auto: the shared-memory sum), TP=2 (parallel.tensor 2), TP=2 with
# sequence parallelism (SP), PP=2 (parallel.pipeline 2, 1F1B), PP=2 interleaved (2 chunks
# per rank) and PP=2 with tied embeddings (the last stage's copy of the embedding table,
# its gradient exchanged with stage 0's each step), alternating, REPETITIONS times each. Reads the last "phases"
# record of metrics.jsonl (rank 0, ms per step over the second half of the steps) and the
# logged tokens/s and prints the medians: forward, backward, exposed communication (DP: the
# gradient sum; PP: the waits for the neighbour stage; TP: none beyond the data group's),
# the tensor group's all-reduces (TP: inside forward and backward) and the whole step.
# usage: benchmarks/training/layouts.sh [BUILD_DIR] [REPETITIONS] [tiny|small] [STEPS] [GLOBAL]
#   micro-batch 1 x 512 (small) or 8 x 256 (tiny) per micro-step; GLOBAL sequences a step.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-build/cpu-release}
reps=${2:-3}
preset=${3:-small}
steps=${4:-6}
global=${5:-8}
case $preset in
  tiny) seq=256 micro=8 ;;
  small) seq=512 micro=1 ;;
  *) echo "layouts.sh: preset must be tiny or small, not '$preset'" >&2; exit 2 ;;
esac
if ((steps < 2 || steps % 2)); then
  echo "layouts.sh: STEPS must be even and at least 2" >&2
  exit 2
fi
source "$here/bench_env.sh"
python3 "$src/tests/e2e/training/synthetic_language.py" generate "$work/data" --seq-len "$seq" \
  --train-samples 256 --valid-samples 2 >/dev/null
for ((i = 1; i <= reps; i++)); do
  for layout in dp2 tp2 sp2 pp2 pv2 pt2; do
    out="$work/$layout-$i"
    rm -rf "$out"
    tensor=1 pipeline=1 sequence=false tied=false
    [[ $layout == tp2 || $layout == sp2 ]] && tensor=2
    [[ $layout == sp2 ]] && sequence=true
    [[ $layout == pp2 || $layout == pv2 || $layout == pt2 ]] && pipeline=2
    [[ $layout == pt2 ]] && tied=true
    schedule=1f1b chunks=1
    [[ $layout == pv2 ]] && schedule=interleaved chunks=2
    mpiexec --oversubscribe -n 2 "$build/bin/dstrain" train "$src/inputs/tiny.yaml" \
      --set "model.preset=$preset" --set "model.tie_embeddings=$tied" \
      --set "data.train=$work/data/train.txt" --set "data.valid=$work/data/valid.txt" \
      --set data.text_separator= --set "data.seq_len=$seq" \
      --set "training.micro_batch_size=$micro" --set "training.global_batch_size=$global" \
      --set "training.max_steps=$steps" --set training.schedule.warmup_steps=1 \
      --set "logging.every_steps=$((steps / 2))" --set eval.every_steps=0 \
      --set eval.batches=1 --set debug.consistency_every=0 --set checkpoint.every_steps=0 \
      --set "parallel.tensor=$tensor" --set "parallel.pipeline=$pipeline" \
      --set "parallel.sequence_parallel=$sequence" \
      --set "parallel.pipeline_schedule=$schedule" --set "parallel.virtual_stages=$chunks" \
      --set "run.output_dir=$out" >"$out.log" 2>&1 || {
      cat "$out.log" >&2
      echo "layouts.sh: the $layout run $i failed" >&2
      exit 1
    }
  done
done
python3 - "$work" "$reps" "$preset" "$seq" "$micro" "$steps" "$global" <<'PY'
import glob, json, statistics, sys
work, reps, preset, seq, micro, steps, glob_b = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
steps = int(steps)
print(f"{preset}, 2 ranks, global batch {glob_b} x {seq} (micro-batch {micro}), {steps} steps; "
      f"medians of {reps} alternating runs (ms per step, rank 0, steps {steps // 2 + 1}-{steps})")
print("| layout | forward | backward | exposed comm | tensor all-reduce | step | tokens/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
res = {}
names = {"dp2": "DP=2", "tp2": "TP=2", "sp2": "TP=2 + SP", "pp2": "PP=2",
         "pv2": "PP=2 interleaved (V=2)", "pt2": "PP=2, tied embeddings"}
for layout in ("dp2", "tp2", "sp2", "pp2", "pv2", "pt2"):
    ph, tps = [], []
    for path in glob.glob(f"{work}/{layout}-*/metrics.jsonl"):
        recs = [json.loads(x) for x in open(path) if x.strip()]
        ph.append([r for r in recs if r["type"] == "phases"][-1])
        tps.append([r for r in recs if r["type"] == "step"][-1]["tokens_per_s"])
    m = {k: statistics.median(p.get(k, 0.0) for p in ph)
         for k in ("forward_ms", "backward_ms", "comm_exposed_ms", "tensor_allreduce_ms",
                   "step_ms")}
    m["tps"] = statistics.median(tps)
    res[layout] = m
    print(f"| {names[layout]} | {m['forward_ms']:.1f} | {m['backward_ms']:.1f} | "
          f"{m['comm_exposed_ms']:.1f} | {m['tensor_allreduce_ms']:.1f} | {m['step_ms']:.1f} | "
          f"{m['tps']:.0f} |")
tp, sp = res["tp2"], res["sp2"]
print(f"tensor: TP=2/DP=2 tokens/s {tp['tps'] / res['dp2']['tps']:.3f}, "
      f"TP=2 + SP/DP=2 {sp['tps'] / res['dp2']['tps']:.3f}, "
      f"PP=2/DP=2 {res['pp2']['tps'] / res['dp2']['tps']:.3f}, "
      f"PP=2 interleaved/PP=2 {res['pv2']['tps'] / res['pp2']['tps']:.3f} (exposed waits "
      f"{res['pv2']['comm_exposed_ms']:.0f} against {res['pp2']['comm_exposed_ms']:.0f} ms); "
      f"TP=2's all-reduces {tp['tensor_allreduce_ms'] / tp['step_ms']:.1%} of its step, "
      f"TP=2 + SP's collectives {sp['tensor_allreduce_ms'] / sp['step_ms']:.1%}; "
      f"PP=2 tied/PP=2 tokens/s {res['pt2']['tps'] / res['pp2']['tps']:.3f} (exposed comm "
      f"{res['pt2']['comm_exposed_ms']:.0f} against {res['pp2']['comm_exposed_ms']:.0f} ms, "
      f"the embedding group's exchange included)")
PY
