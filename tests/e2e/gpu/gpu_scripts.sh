#!/usr/bin/env bash
# The decisions of the GPU check scripts, made on the CPU (docs/gpu.md):
#   gpu_scripts.sh DSTRAIN SOURCE_DIR WORK_DIR
# 1. summarize.py on synthetic metrics: a loss difference under the threshold passes, one
#    over it, a missing step, a run on the wrong back end, a failed GoogleTest and one
#    whose tests all skipped themselves (no device seen) fail;
#    throughput figures (median, MFU, phases after the warm-up, the ratio to PyTorch's
#    tokens/s where it ran) come out as computed here.
# 2. summarize.py's parameter count and FLOPs per token equal `dstrain check`'s for
#    inputs/gpu/deepseek-1b.yaml (the plan's closed form, lib/model/plan.cpp).
# 3. inputs/gpu/parity.yaml and bf16_drift.yaml, trained briefly on the CPU, summarised
#    as benchmarks/gpu/parity does (its dry-run mode): the decks are valid and the
#    metrics they leave are what the summary reads.
set -euo pipefail
dstrain=$(readlink -f "$1") src=$(readlink -f "$2") work=$(readlink -m "$3")
summarize=$src/benchmarks/gpu/summarize.py
rm -rf "$work"
mkdir -p "$work"
cd "$work"

# --- 1. synthetic ---------------------------------------------------------------------------
python3 - "$summarize" <<'PY'
import importlib.util, json, math, os, sys
spec = importlib.util.spec_from_file_location("summarize", sys.argv[1])
s = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s)

def run(raw, name, losses, kernels, rc=0, extra=None):
    os.makedirs(os.path.join(raw, name), exist_ok=True)
    with open(os.path.join(raw, name, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"type": "header", "format_version": 1}) + "\n")
        for i, l in enumerate(losses, 1):
            r = {"type": "step", "step": i, "loss": l, "tokens_per_s": 1000.0 + i, "step_ms": 10.0}
            r.update((extra or {}).get(i, {}))
            f.write(json.dumps(r, sort_keys=True) + "\n")
    with open(os.path.join(raw, name, "deck.yaml"), "w") as f:
        f.write(f"training:\n  max_steps: {len(losses)}\n")
    with open(os.path.join(raw, name + ".rc"), "w") as f:
        f.write(f"{rc}\n")
    with open(os.path.join(raw, name + ".log"), "w") as f:
        f.write(f"layout: 1 rank | comm mpi | kernels {kernels} (Kokkos Serial) | device cuda\n")

def parity(tag, gpu_scale=1.0, drop_step=None, gpu_kernels="cuda", gtest_failures=0, gtest_skipped=False):
    raw = f"raw-{tag}"
    base = [5.0 - 0.1 * i for i in range(20)]
    run(raw, "cpu", base, "kokkos")
    g = [x * gpu_scale for x in base]
    run(raw, "gpu", g, gpu_kernels)
    run(raw, "cpu_moe", base, "kokkos")  # the tiny-moe pair agrees exactly
    run(raw, "gpu_moe", base, "cuda")
    if drop_step:  # a run that died before that step
        run(raw, "gpu", g[: drop_step - 1], gpu_kernels)
        with open(os.path.join(raw, "cpu", "deck.yaml"), "w") as f:
            f.write("training:\n  max_steps: 20\n")
    d = [6.0 - 0.01 * i for i in range(200)]
    run(raw, "fp32", d, "cuda")
    run(raw, "bf16", [x * 1.01 for x in d], "cuda")
    with open(os.path.join(raw, "kernels_cuda_test.rc"), "w") as f:
        f.write("1\n" if gtest_failures else "0\n")
    with open(os.path.join(raw, "kernels_cuda_test.json"), "w") as f:
        fails = [{"failure": "expected 1 got 2\nmore"}] if gtest_failures else []
        result = "SKIPPED" if gtest_skipped else "COMPLETED"
        json.dump({"tests": 2, "failures": gtest_failures, "disabled": 0, "testsuites": [
            {"name": "Rmsnorm", "testsuite": [{"name": "Forward", "failures": fails, "result": result},
                                             {"name": "Backward", "result": result}]}]}, f)
    return s.parity_report(raw)

ok = parity("ok", gpu_scale=1 + 5e-5)
assert ok["passed"], ok["failures"]
c = ok["cpu_vs_gpu"]
assert c["steps_compared"] == 20 and abs(c["max_rel_diff"] - 5e-5 / (1 + 5e-5)) < 1e-12, c
d = ok["bf16_drift"]
assert d["passed"] and abs(d["final_rel_diff"] - 0.01 / 1.01) < 1e-9, d
assert ok["gpu_tests"]["kernels_cuda_test"]["status"] == "passed"
assert ok["gpu_tests"]["blas_cuda_test"]["status"] == "absent"

assert ok["cpu_vs_gpu_moe"]["passed"] and ok["cpu_vs_gpu_moe"]["max_rel_diff"] == 0.0
over = parity("over", gpu_scale=1 + 2e-4)
assert not over["passed"] and "max relative difference" in over["failures"][0], over["failures"]
assert over["cpu_vs_gpu_moe"]["passed"] and over["failures"][0].startswith("cpu_vs_gpu: ")
short = parity("short", drop_step=15)
assert not short["passed"] and "steps missing" in short["failures"][0], short["failures"]
same = parity("same-backend", gpu_kernels="kokkos")
assert not same["passed"] and any("used kernels kokkos, not cuda" in f for f in same["failures"])
gt = parity("gtest", gtest_failures=1)
assert not gt["passed"] and gt["gpu_tests"]["kernels_cuda_test"]["failed"][0]["name"] == "Rmsnorm.Forward"
skip = parity("gtest-skipped", gtest_skipped=True)  # no device seen: every test skipped
assert not skip["passed"] and skip["gpu_tests"]["kernels_cuda_test"]["status"] == "skipped"
assert s.relative_difference(float("nan"), 1.0) == math.inf
json.dumps(s.finite({"x": math.inf}), allow_nan=False)

# Throughput: 30 steps, the first 10 excluded; phases every 5 steps.
raw = "raw-throughput"
tps = {i: {"tokens_per_s": 100.0 * i, "peak_mem_bytes": 1000 + i} for i in range(1, 31)}
run(raw, "train", [3.0] * 30, "cuda", extra=tps)
with open(os.path.join(raw, "train", "metrics.jsonl"), "a") as f:
    for step in (5, 10, 15, 20, 25, 30):
        f.write(json.dumps({"type": "phases", "step": step, "forward_ms": float(step), "step_ms": 2.0 * step}) + "\n")
with open(os.path.join(raw, "train", "deck.yaml"), "w") as f:
    f.write("model:\n  preset: deepseek-1b\n  vocab_size: 102400\n  d_model: 2048\n  n_layers: 24\n"
            "  n_heads: 16\n  n_kv_heads: 16\n  ffn_dim: 5504\n  tie_embeddings: false\n\n"
            "data:\n  seq_len: 2048\n\ntraining:\n  max_steps: 30\n  micro_batch_size: 4\n"
            "  precision: bf16\n\nlogging:\n  every_steps: 1\n")
with open(os.path.join(raw, "gemm.rc"), "w") as f:
    f.write("0\n")
with open(os.path.join(raw, "gemm.jsonl"), "w") as f:
    f.write('{"mode": "fp32", "tflops": 50.0}\nnot json\n{"mode": "bf16", "tflops": 800.0}\n')
with open(os.path.join(raw, "smi.csv"), "w") as f:
    f.write("2026/01/01 00:00:00.000, 1000, 0, 345, 80.5\n2026/01/01 00:00:00.500, 90000, 99, 1980, 650.0\n")
t = s.throughput_report(raw, warmup=10)
assert t["passed"], t["failures"]
assert t["pytorch"] == {}, t["pytorch"]  # none ran: nothing reported, nothing failed
with open(os.path.join(raw, "torch-eager.json"), "w") as f:
    f.write(json.dumps({"mode": "eager", "median_tokens_per_s": 4100.0}) + "\n")
t = s.throughput_report(raw, warmup=10)
assert t["passed"] and list(t["pytorch"]) == ["eager"], t["pytorch"]
assert t["pytorch"]["eager"]["dstrain_ratio"] == 0.5, t["pytorch"]
tr = t["training"]
assert tr["steps_measured"] == 20 and tr["median_tokens_per_s"] == 2050.0, tr
fpt = 6.0 * (1633781760 - 209715200) + 12.0 * 24 * 2048 * 2048
assert tr["parameters"] == 1633781760 and tr["flops_per_token"] == fpt
assert abs(tr["mfu_vs_peak"] - fpt * 2050.0 / 989e12) < 1e-12
assert abs(tr["mfu_vs_measured_bf16_gemm"] - fpt * 2050.0 / 800e12) < 1e-12
assert tr["phases_steps"] == [15, 20, 25, 30] and tr["phases_ms"]["forward_ms"] == 22.5, tr
assert tr["peak_mem_bytes"] == 1030 and t["nvidia_smi"]["peak_memory_used_mib"] == 90000
assert t["gemm"]["modes"]["bf16"]["tflops"] == 800.0
print("gpu scripts: synthetic cases ok")
PY

# --- 2. the FLOPs formula against the plan ------------------------------------------------------
"$dstrain" check "$src/inputs/gpu/deepseek-1b.yaml" --set kernels.backend=kokkos --force \
  --deck-out resolved.yaml >check.log 2>&1
python3 - "$summarize" resolved.yaml check.log <<'PY'
import importlib.util, re, sys
spec = importlib.util.spec_from_file_location("summarize", sys.argv[1])
s = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s)
deck = s.parse_resolved_deck(open(sys.argv[2]).read())
log = open(sys.argv[3]).read()
n = int(re.search(r"parameters +[0-9.]+ B +\((\d+):", log).group(1))
assert s.parameter_count(deck["model"])["total"] == n == 1633781760, n
fpt = s.training_flops_per_token(deck["model"], deck["data"]["seq_len"])
shown = re.search(r"FLOPs per token +([0-9.]+) B", log).group(1)
assert f"{fpt / 1e9:.3g}" == shown, (fpt, shown)
print(f"gpu scripts: deepseek-1b {n} parameters, {fpt:.6g} FLOPs per token, as dstrain check")
PY

# --- 3. the decks on the CPU, summarised ----------------------------------------------------------
"$src/scripts/prepare-demo-data" data >/dev/null
raw="raw-decks"
mkdir -p "$raw"
train() {  # train NAME DECK ARGS...: as benchmarks/gpu/parity's train(), on the CPU
  local name=$1 deck=$2
  shift 2
  set +e
  "$dstrain" train "$src/inputs/gpu/$deck" --set data.train=data/fortunes-train.txt \
    --set "run.output_dir=runs/$name" --set kernels.backend=kokkos --set logging.peak_gflops=100 \
    "$@" >"$raw/$name.log" 2>&1
  echo $? >"$raw/$name.rc"
  set -e
  mkdir -p "$raw/$name"
  cp "runs/$name/metrics.jsonl" "runs/$name/deck.yaml" "$raw/$name/"
  # Its checkpoint and final parameters (up to 450 MB) are not read here.
  [[ "${DSTRAIN_KEEP_TEST_OUTPUT:-}" == 1 ]] || rm -rf "runs/$name"
}
train cpu parity.yaml --set training.max_steps=3 --set training.schedule.warmup_steps=1
train gpu parity.yaml --set training.max_steps=3 --set training.schedule.warmup_steps=1
train cpu_moe parity.yaml --set training.max_steps=3 --set training.schedule.warmup_steps=1 \
  --set model.preset=tiny-moe
train gpu_moe parity.yaml --set training.max_steps=3 --set training.schedule.warmup_steps=1 \
  --set model.preset=tiny-moe
small=(--set training.max_steps=2 --set training.schedule.warmup_steps=1 --set data.seq_len=64
  --set training.micro_batch_size=2 --set training.global_batch_size=2)
train fp32 bf16_drift.yaml "${small[@]}" --set training.precision=fp32
train bf16 bf16_drift.yaml "${small[@]}" --set training.precision=bf16
python3 "$summarize" parity "$raw" parity.json --dry-run
python3 - parity.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["cpu_vs_gpu"]
# The same deck on the same back end twice: bit-identical losses (deterministic kernels).
assert r["passed"] and c["steps_compared"] == 3 and c["max_rel_diff"] == 0.0, c
m = r["cpu_vs_gpu_moe"]
assert m["preset"] == "tiny-moe" and m["steps_compared"] == 3 and m["max_rel_diff"] == 0.0, m
assert r["bf16_drift"]["steps_compared"] == 2 and r["bf16_drift"]["max_rel_diff"] > 0.0
print("gpu scripts: decks ok")
PY
[[ "${DSTRAIN_KEEP_TEST_OUTPUT:-}" == 1 ]] || rm -rf "$work"  # passed: nothing to inspect
echo "gpu scripts: ok"
