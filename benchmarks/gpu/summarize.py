#!/usr/bin/env python3
"""Turns the raw outputs of benchmarks/gpu/parity and benchmarks/gpu/throughput into
their JSON reports (docs/gpu.md). Standard library only: it runs under whatever python3
the GPU machine has.

    summarize.py parity RAW_DIR OUT_JSON [--threshold 1e-4] [--drift-final 0.05]
                 [--drift-max 0.10] [--dry-run]
    summarize.py throughput RAW_DIR OUT_JSON [--warmup 10] [--peak-tflops 989]
                 [--dry-run]

RAW_DIR holds what the shell scripts left (names below); the exit code is 0 when every
check passed, 1 when one failed. The functions are imported by the CPU test
tests/e2e/gpu/gpu_scripts.sh.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys

# --- reading -----------------------------------------------------------------------------


def read_jsonl(path):
    """Records of a JSON Lines file; lines that are not JSON objects are skipped."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def read_text(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def read_rc(path):
    """Exit code a script wrote to PATH, or None."""
    text = read_text(path).strip()
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def parse_resolved_deck(text):
    """The resolved deck (config::to_yaml: sections of 'key: value' lines) as
    {section: {key: value}}; values are int, float, bool or str. Nested sections
    (training.optimizer) are left out: nothing here needs them."""
    deck, section = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([a-z_]+):\s*", line)
        if m:
            section = deck.setdefault(m.group(1), {})
            continue
        m = re.fullmatch(r"  ([a-z_]+):\s*(.*?)\s*", line)
        if m and section is not None:
            section[m.group(1)] = _scalar(m.group(2))
    return deck


def _scalar(v):
    if v in ("true", "false"):
        return v == "true"
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return v[1:-1]
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


# --- the model's cost (lib/model/plan.cpp, the project's one definition) ------------------


def parameter_count(model):
    """count_parameters of lib/model/plan.cpp: embedding V*C, per layer q/o C*C each,
    k/v C*kv each (kv = n_kv_heads * C / n_heads), SwiGLU 3*C*F, two norms 2*C, the
    final norm C and, unless tied, the head V*C."""
    v, c, layers = model["vocab_size"], model["d_model"], model["n_layers"]
    kv = model["n_kv_heads"] * (c // model["n_heads"])
    per_layer = 2 * c * c + 2 * c * kv + 3 * c * model["ffn_dim"] + 2 * c
    head = 0 if model.get("tie_embeddings") else v * c
    return {"embedding": v * c, "per_layer": per_layer, "layers": per_layer * layers,
            "final_norm": c, "head": head, "total": v * c + per_layer * layers + c + head}


def training_flops_per_token(model, seq_len):
    """training_flops_per_token of lib/model/plan.cpp: 6 x (parameters without the
    embedding, the head counted even when tied) + 12 x n_layers x seq_len x d_model."""
    p = parameter_count(model)
    non_embedding = p["total"] - p["embedding"] + (p["embedding"] if model.get("tie_embeddings") else 0)
    return 6.0 * non_embedding + 12.0 * model["n_layers"] * seq_len * model["d_model"]


# --- comparing runs ----------------------------------------------------------------------


def step_losses(records):
    """{step: loss} of the `step` records (docs/metrics.md)."""
    return {r["step"]: r["loss"] for r in records if r.get("type") == "step" and "loss" in r}


def relative_difference(a, b):
    """|a - b| relative to the larger magnitude (symmetric; inf when one is not finite)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def compare_losses(ref, other, expected_steps):
    """Relative loss differences over the steps both runs logged. Every step 1..N must
    be in both, or the comparison fails (a run that died early proves nothing)."""
    a, b = step_losses(ref), step_losses(other)
    wanted = list(range(1, expected_steps + 1))
    missing = [s for s in wanted if s not in a or s not in b]
    diffs = {s: relative_difference(a[s], b[s]) for s in wanted if s in a and s in b}
    out = {"steps_compared": len(diffs), "steps_expected": expected_steps,
           "steps_missing": missing[:20], "max_rel_diff": None, "max_at_step": None,
           "final_rel_diff": None, "mean_rel_diff": None}
    if diffs:
        worst = max(diffs, key=lambda s: diffs[s])
        last = max(diffs)
        out.update(max_rel_diff=diffs[worst], max_at_step=worst, final_rel_diff=diffs[last],
                   mean_rel_diff=statistics.fmean(diffs.values()))
    return out


def attention_path(log):
    """What the training log's "attention:" line says (GPU runs only), or None."""
    m = re.search(r"attention: (.*)$", log, re.M)
    return m.group(1).strip() if m else None


def run_summary(raw, name):
    """What one training run left in RAW: rc, steps, losses, wall time, the error line."""
    records = read_jsonl(os.path.join(raw, name, "metrics.jsonl"))
    losses = step_losses(records)
    log = read_text(os.path.join(raw, name + ".log"))
    errors = [l for l in log.splitlines() if "error" in l.lower()][:5]
    steps = [r for r in records if r.get("type") == "step"]
    return {
        "rc": read_rc(os.path.join(raw, name + ".rc")),
        "seconds": _float_or_none(read_text(os.path.join(raw, name + ".seconds")).strip()),
        "steps_logged": len(losses),
        "first_loss": losses[min(losses)] if losses else None,
        "final_loss": losses[max(losses)] if losses else None,
        "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps) if steps else None,
        "layout": next((l.strip() for l in log.splitlines() if "layout:" in l), None),
        "attention": attention_path(log),
        "errors": errors,
    }


def _float_or_none(s):
    try:
        return float(s)
    except ValueError:
        return None


def gtest_summary(raw, name):
    """A GoogleTest binary's outcome from its --gtest_output=json file and exit code:
    status passed, failed, timeout, skipped (every test skipped itself) or absent."""
    rc = read_rc(os.path.join(raw, name + ".rc"))
    if rc is None:
        return {"status": "absent"}
    out = {"rc": rc, "seconds": _float_or_none(read_text(os.path.join(raw, name + ".seconds")).strip())}
    try:
        with open(os.path.join(raw, name + ".json"), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError):
        report = None
    if report:
        failed = []
        skipped = 0
        for suite in report.get("testsuites", []):
            for t in suite.get("testsuite", []):
                if t.get("result") == "SKIPPED":
                    skipped += 1
                if t.get("failures"):
                    msg = t["failures"][0].get("failure", "").strip().splitlines()
                    failed.append({"name": suite.get("name", "") + "." + t.get("name", ""),
                                   "message": " | ".join(msg[:3])[:400]})
        out.update(tests=report.get("tests"), failures=report.get("failures"),
                   disabled=report.get("disabled"), skipped=skipped, failed=failed[:20])
    else:
        tail = read_text(os.path.join(raw, name + ".log")).strip().splitlines()[-5:]
        out.update(tests=None, failures=None, log_tail=tail)
    if rc == 124 or rc == 137:
        out["status"] = "timeout"
    elif rc == 0 and report and report.get("tests") and out["skipped"] >= report["tests"]:
        out["status"] = "skipped"  # every test skipped itself: no device seen
    elif rc == 0 and report and not report.get("failures"):
        out["status"] = "passed"
    else:
        out["status"] = "failed"
    return out


# --- parity ------------------------------------------------------------------------------


def device_summary(raw):
    env = {}
    try:
        with open(os.path.join(raw, "env.json"), encoding="utf-8") as f:
            env = json.load(f)
    except (OSError, ValueError):
        pass
    gpu = read_text(os.path.join(raw, "gpu.csv")).strip()
    return {"gpu": gpu or None, "environment": env}


def parity_report(raw, threshold=1e-4, drift_final=0.05, drift_max=0.10, dry_run=False):
    failures = []
    tests = {}
    for t in ("kernels_cuda_test", "blas_cuda_test", "attention_cudnn_test"):
        tests[t] = gtest_summary(raw, t)
        # On the GPU machine a test binary that skips every test did not see the GPU.
        if tests[t]["status"] in ("failed", "timeout", "skipped"):
            failures.append(f"{t}: {tests[t]['status']}")

    # The dense model (tiny) and the V3 layers (tiny-moe: latent attention, DeepSeekMoE),
    # each trained with kokkos and with cuda from the same deck.
    pairs = {}
    for key, (a, b, preset) in {"cpu_vs_gpu": ("cpu", "gpu", "tiny"),
                                "cpu_vs_gpu_moe": ("cpu_moe", "gpu_moe", "tiny-moe")}.items():
        pairs[key] = _backend_pair(raw, key, a, b, preset, threshold, dry_run, failures)
    cpu_vs_gpu = pairs["cpu_vs_gpu"]

    ddeck = parse_resolved_deck(read_text(os.path.join(raw, "fp32", "deck.yaml")))
    dsteps = ddeck.get("training", {}).get("max_steps") or 200
    f32, b16 = run_summary(raw, "fp32"), run_summary(raw, "bf16")
    dcmp = compare_losses(read_jsonl(os.path.join(raw, "fp32", "metrics.jsonl")),
                          read_jsonl(os.path.join(raw, "bf16", "metrics.jsonl")), dsteps)
    dok = (f32["rc"] == 0 and b16["rc"] == 0 and not dcmp["steps_missing"]
           and dcmp["max_rel_diff"] is not None and dcmp["max_rel_diff"] <= drift_max
           and dcmp["final_rel_diff"] <= drift_final)
    if not dok:
        failures.append("bf16_drift: " + _why(f32, b16, dcmp, drift_max, drift_final))
    backend = "kokkos" if dry_run else "cuda"
    wrong = _backend_problems({"fp32": (f32, backend), "bf16": (b16, backend)})
    if wrong:
        dok = False
        failures.extend("bf16_drift: " + w for w in wrong)
    drift = {"deck": "inputs/gpu/bf16_drift.yaml",
             "limits": {"max_rel_diff": drift_max, "final_rel_diff": drift_final},
             "fp32": f32, "bf16": b16, **dcmp, "passed": dok}

    return {"check": "parity", "format_version": 1, "dry_run": dry_run,
            "passed": not failures, "failures": failures,
            "seconds": _float_or_none(read_text(os.path.join(raw, "total.seconds")).strip()),
            **device_summary(raw), "gpu_tests": tests, "cpu_vs_gpu": cpu_vs_gpu,
            "cpu_vs_gpu_moe": pairs["cpu_vs_gpu_moe"], "bf16_drift": drift}


def _backend_pair(raw, key, a, b, preset, threshold, dry_run, failures):
    """inputs/gpu/parity.yaml trained as run `a` (kokkos) and run `b` (cuda): every step's
    loss within `threshold` relative; a failure appends its reason to `failures`."""
    deck = parse_resolved_deck(read_text(os.path.join(raw, a, "deck.yaml")))
    steps = deck.get("training", {}).get("max_steps") or 20
    cpu, gpu = run_summary(raw, a), run_summary(raw, b)
    cmp = compare_losses(read_jsonl(os.path.join(raw, a, "metrics.jsonl")),
                         read_jsonl(os.path.join(raw, b, "metrics.jsonl")), steps)
    ok = (cpu["rc"] == 0 and gpu["rc"] == 0 and not cmp["steps_missing"]
          and cmp["max_rel_diff"] is not None and cmp["max_rel_diff"] <= threshold)
    if not ok:
        failures.append(key + ": " + _why(cpu, gpu, cmp, threshold))
    # Identical losses prove nothing if both runs took the same back end.
    wrong = _backend_problems({a: (cpu, "kokkos"), b: (gpu, "kokkos" if dry_run else "cuda")})
    if wrong:
        ok = False
        failures.extend(key + ": " + w for w in wrong)
    return {"deck": "inputs/gpu/parity.yaml", "preset": preset, "threshold_rel": threshold,
            "kokkos": cpu, "cuda": gpu, **cmp, "passed": ok}


def _backend_problems(runs):
    """Runs whose start-up layout line names another kernel back end than expected."""
    out = []
    for name, (run, expected) in runs.items():
        m = re.search(r"\| kernels (\S+)", run["layout"] or "")
        run["kernels"] = m.group(1) if m else None
        if run["rc"] is not None and run["layout"] and run["kernels"] != expected:
            out.append(f"the {name} run used kernels {run['kernels']}, not {expected}")
    return out


def _why(a, b, cmp, limit, final_limit=None):
    if a["rc"] != 0 or b["rc"] != 0:
        return f"a run failed (exit codes {a['rc']} and {b['rc']})"
    if cmp["steps_missing"]:
        return f"steps missing from the metrics: {cmp['steps_missing']}"
    if cmp["max_rel_diff"] is None:
        return "no losses to compare"
    if final_limit is not None and cmp["final_rel_diff"] > final_limit:
        return f"final relative difference {cmp['final_rel_diff']:.3g} > {final_limit:g}"
    return f"max relative difference {cmp['max_rel_diff']:.3g} at step {cmp['max_at_step']} > {limit:g}"


# --- throughput ----------------------------------------------------------------------------


def gemm_summary(raw):
    rc = read_rc(os.path.join(raw, "gemm.rc"))
    if rc is None:
        return {"status": "absent", "modes": {}}
    modes = {}
    for r in read_jsonl(os.path.join(raw, "gemm.jsonl")):
        mode = r.get("mode") or r.get("name") or r.get("dtype")
        if mode is not None and "tflops" in r:
            modes[str(mode)] = r
    return {"status": "passed" if rc == 0 and modes else "failed", "rc": rc, "modes": modes}


def nvidia_smi_peak(raw):
    """Largest memory.used (MiB) and the SM clock/power seen by the nvidia-smi sampler
    (CSV: timestamp, memory.used, utilization.gpu, clocks.sm, power.draw)."""
    used, util, clock, power = [], [], [], []
    for line in read_text(os.path.join(raw, "smi.csv")).splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5:
            continue
        for col, into in ((cols[1], used), (cols[2], util), (cols[3], clock), (cols[4], power)):
            v = _float_or_none(col)
            if v is not None:
                into.append(v)
    if not used:
        return None
    return {"samples": len(used), "peak_memory_used_mib": max(used),
            "median_utilization_pct": statistics.median(util) if util else None,
            "median_sm_clock_mhz": statistics.median(clock) if clock else None,
            "max_power_w": max(power) if power else None}


def plan_summary(raw):
    """The `dstrain check` plan the run was sized by (the last check that ran)."""
    text = read_text(os.path.join(raw, "check.log"))
    out = {}
    for key in ("memory per rank", "activations", "workspace", "parameters", "gradients",
                "optimizer state", "available per rank"):
        m = re.search(r"^\s+" + re.escape(key) + r"\s+([0-9.]+ [KMGT]?i?B)", text, re.M)
        if m:
            out[key.replace(" ", "_")] = m.group(1)
    return out or None


def throughput_report(raw, warmup=10, peak_tflops=989.0, dry_run=False):
    failures = []
    gemm = gemm_summary(raw)
    if gemm["status"] == "failed":
        failures.append("gpu_gemm_rate failed")
    run_dir = os.path.join(raw, "train")
    deck = parse_resolved_deck(read_text(os.path.join(run_dir, "deck.yaml")))
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    steps = [r for r in records if r.get("type") == "step"]
    phases = [r for r in records if r.get("type") == "phases"]
    max_steps = deck.get("training", {}).get("max_steps")
    log = read_text(os.path.join(raw, "train.log"))
    m = re.search(r"model: .*?, ([0-9.]+ [KMBT]?) FLOPs per token", log)
    training = {"deck": "inputs/gpu/deepseek-1b.yaml", "rc": read_rc(os.path.join(raw, "train.rc")),
                "stopped_after_last_record": os.path.exists(os.path.join(raw, "train.killed")),
                "steps_logged": len(steps), "steps_expected": max_steps,
                "warmup_steps_excluded": warmup, "log_flops_per_token": m.group(1) if m else None,
                "errors": [l for l in log.splitlines() if "error" in l.lower()][:5],
                "attention": attention_path(log),
                "plan": plan_summary(raw)}
    if "model" in deck:
        seq = deck["data"]["seq_len"]
        mb = deck["training"]["micro_batch_size"]
        fpt = training_flops_per_token(deck["model"], seq)
        training.update(preset=deck["model"].get("preset"), precision=deck["training"].get("precision"),
                        seq_len=seq, micro_batch_size=mb, global_batch_size=deck["training"].get("global_batch_size"),
                        parameters=parameter_count(deck["model"])["total"], flops_per_token=fpt)
    measured = [r for r in steps if r["step"] > warmup]
    if measured and "flops_per_token" in training:
        tps = statistics.median(r["tokens_per_s"] for r in measured)
        model_tflops = training["flops_per_token"] * tps / 1e12
        bf16 = gemm["modes"].get("bf16", {}).get("tflops")
        training.update(
            median_tokens_per_s=tps, median_step_ms=statistics.median(r["step_ms"] for r in measured),
            steps_measured=len(measured), model_tflops_per_s=model_tflops,
            peak_tflops=peak_tflops, mfu_vs_peak=model_tflops / peak_tflops,
            measured_bf16_gemm_tflops=bf16, mfu_vs_measured_bf16_gemm=model_tflops / bf16 if bf16 else None,
            final_loss=steps[-1]["loss"],
            # dstrain's own MFU (against the data-sheet peak it names in its log), as a
            # cross-check of the figure above.
            median_mfu_metrics=statistics.median(r.get("mfu", 0.0) for r in measured),
            # GPU runs: the device allocator's peak; CPU runs: rank 0's resident set.
            peak_mem_bytes=max(r.get("peak_mem_bytes", 0) for r in steps))
        # Device memory, if the metrics carry it under a name of their own (GPU builds).
        dev = {k: max(r[k] for r in steps if k in r) for k in sorted({k for r in steps for k in r})
               if ("device" in k or "gpu" in k) and "mem" in k}
        if dev:
            training["device_memory"] = dev
        # Per-phase times: each `phases` record holds the means over the steps since the
        # previous one; those wholly after the warm-up are averaged, weighted by steps.
        late, prev = [], 0
        for p in sorted(phases, key=lambda p: p["step"]):
            if prev >= warmup:
                late.append((p, p["step"] - prev))
            prev = p["step"]
        if late:
            keys = [k for k in late[0][0] if k.endswith("_ms")]
            n = sum(w for _, w in late)
            training["phases_ms"] = {k: sum(p[k] * w for p, w in late) / n for k in keys}
            training["phases_steps"] = [prev_p["step"] for prev_p, _ in late]
        if not all(math.isfinite(r["loss"]) for r in steps):
            failures.append("training: a non-finite loss")
    else:
        failures.append("training: no steps after the warm-up were logged")
    if max_steps and len(steps) < max_steps:
        failures.append(f"training: {len(steps)} of {max_steps} steps logged")
    if training["rc"] not in (0, None) and not training["stopped_after_last_record"]:
        failures.append(f"training: exit code {training['rc']}")
    return {"check": "throughput", "format_version": 1, "dry_run": dry_run,
            "passed": not failures, "failures": failures,
            "seconds": _float_or_none(read_text(os.path.join(raw, "total.seconds")).strip()),
            **device_summary(raw), "gemm": gemm, "nvidia_smi": nvidia_smi_peak(raw),
            "training": training, "pytorch": pytorch_summary(raw, training)}


def pytorch_summary(raw, training):
    """benchmarks/gpu/torch_reference.py's line per mode (eager, compile), where it ran, with
    dstrain's median tokens/s as a fraction of each (`dstrain_ratio`). Informational: it
    never fails the check."""
    out = {}
    for mode in ("eager", "compile"):
        lines = read_jsonl(os.path.join(raw, f"torch-{mode}.json"))
        if not lines:
            continue
        r = dict(lines[-1])
        ours = training.get("median_tokens_per_s")
        theirs = r.get("median_tokens_per_s")
        r["dstrain_ratio"] = ours / theirs if ours and theirs else None
        out[mode] = r
    return out


# --- command line --------------------------------------------------------------------------


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("parity")
    p.add_argument("raw")
    p.add_argument("out")
    p.add_argument("--threshold", type=float, default=1e-4)
    p.add_argument("--drift-final", type=float, default=0.05)
    p.add_argument("--drift-max", type=float, default=0.10)
    p.add_argument("--dry-run", action="store_true")
    t = sub.add_parser("throughput")
    t.add_argument("raw")
    t.add_argument("out")
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--peak-tflops", type=float, default=989.0)
    t.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.what == "parity":
        report = parity_report(a.raw, a.threshold, a.drift_final, a.drift_max, a.dry_run)
    else:
        report = throughput_report(a.raw, a.warmup, a.peak_tflops, a.dry_run)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(finite(report), f, indent=2, allow_nan=False)
        f.write("\n")
    print_summary(report)
    return 0 if report["passed"] else 1


def finite(v):
    """The report with non-finite numbers as the strings "inf", "-inf", "nan" (strict
    JSON has no such numbers)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def _fmt(v, spec=".4g"):
    return "n/a" if v is None else format(v, spec)


def print_summary(r):
    say = lambda s: print(f"{r['check']}: {s}")  # noqa: E731
    if r["check"] == "parity":
        for name, t in r["gpu_tests"].items():
            extra = f" ({t.get('tests')} tests, {t.get('failures')} failures)" if t.get("tests") is not None else ""
            say(f"{name}: {t['status']}{extra}")
        for c in (r["cpu_vs_gpu"], r["cpu_vs_gpu_moe"]):
            say(f"{c['preset']} kokkos vs cuda, {c['steps_compared']}/{c['steps_expected']} steps: max rel "
                f"diff {_fmt(c['max_rel_diff'])} (step {c['max_at_step']}), final "
                f"{_fmt(c['final_rel_diff'])}, threshold {c['threshold_rel']:g}: "
                f"{'pass' if c['passed'] else 'FAIL'}")
        d = r["bf16_drift"]
        say(f"bf16 vs fp32, {d['steps_compared']}/{d['steps_expected']} steps: max rel diff "
            f"{_fmt(d['max_rel_diff'])} (step {d['max_at_step']}), final {_fmt(d['final_rel_diff'])}: "
            f"{'pass' if d['passed'] else 'FAIL'}")
    else:
        g = r["gemm"]
        say("gemm " + (", ".join(f"{m} {_fmt(v.get('tflops'), '.1f')} TFLOP/s" for m, v in g["modes"].items())
                       or g["status"]))
        t = r["training"]
        say(f"{t.get('preset')} {t.get('precision')} micro-batch {t.get('micro_batch_size')} x seq "
            f"{t.get('seq_len')}: {t['steps_logged']} steps, median {_fmt(t.get('median_tokens_per_s'), '.0f')} "
            f"tok/s over {t.get('steps_measured')} steps after {t['warmup_steps_excluded']}, "
            f"{_fmt(t.get('model_tflops_per_s'), '.1f')} TFLOP/s, MFU {_fmt(t.get('mfu_vs_peak'), '.3f')} "
            f"of {t.get('peak_tflops')} / {_fmt(t.get('mfu_vs_measured_bf16_gemm'), '.3f')} of the measured bf16 GEMM")
        if r.get("nvidia_smi"):
            say(f"nvidia-smi peak memory used {r['nvidia_smi']['peak_memory_used_mib']:.0f} MiB")
        if t.get("phases_ms"):
            say("phases (ms/step): " + ", ".join(f"{k} {v:.1f}" for k, v in t["phases_ms"].items()))
        for mode, p in r.get("pytorch", {}).items():
            say(f"pytorch {mode}: median {_fmt(p.get('median_tokens_per_s'), '.0f')} tok/s, MFU "
                f"{_fmt(p.get('mfu_vs_peak'), '.3f')}, peak memory {_fmt(p.get('peak_mem_bytes'), '.4g')} B; "
                f"dstrain at {_fmt(p.get('dstrain_ratio'), '.2f')} of it")
    for f in r["failures"]:
        say("FAILED: " + f)
    say("passed" if r["passed"] else "FAILED")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
