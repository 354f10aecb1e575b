#!/usr/bin/env python3
"""dstrain against PyTorch DDP, side by side in one run (driven by ddp_compare.sh).

For each model case, repeated REPS times with the implementations interleaved (so both
see the same background load): dstrain train at 1 and 2 ranks, and ddp_reference.py
(transformers' LlamaForCausalLM, DDP over gloo, 1 thread per process) at 1 and 2
processes, every run with the same per-rank micro-batch and sequence length (weak
scaling: the global batch is micro x ranks, no accumulation). dstrain's rate is the median
of its per-step tokens_per_s records in metrics.jsonl after WARMUP steps; PyTorch's the
median of its timed steps after WARMUP. Figures are the medians over the repetitions.

  model GFLOP/s = model FLOPs per token (docs/performance.md) x tokens/s
  MFU           = model GFLOP/s / (SGEMM peak per core x ranks), the peak being the
                  median of the single-thread SGEMM 2048^3 rates dstrain measured at the
                  start of its runs (the same OpenBLAS and environment)
  scaling       = tokens/s at 2 ranks / (2 x tokens/s at 1 rank)
  MFU near      = the median over repetitions of each run's MFU against the peak measured
                  seconds from it: a dstrain run's own start-up peak; for PyTorch, that of the
                  dstrain run just before (same rank count). Rate and peak then share the
                  VM's speed of the moment.
  straggle      = for dstrain's 2-rank runs, the slower rank's work per step (data +
                  forward + backward) over the faster's, from the run's last phases record
                  (work_ms_max / work_ms_min, docs/metrics.md): 1.00 when both cores ran
                  alike; a synchronous step waits for the slower.
  step by step  = from the same record: the ranks' work apart per step (straggle_ms, each
                  step's slower rank minus its faster), as a share of the 2-rank step, and
                  rank 0's exposed communication that was not waiting for the slower rank
                  (comm_exposed_ms - comm_peer_wait_ms): the sums' own tail, what the
                  communication costs once both ranks are done.
  ceiling       = the 1 -> 2 scaling of a synchronous step with no communication at all
                  (training_sync_ceiling_benchmark, next to the dstrain binary's build: tiny's
                  layer products on both ranks, a barrier after each step, against rank 0's
                  alone, paired step by step), run once per repetition with the same
                  launcher: what the host's two cores, each changing speed by itself, leave
                  to any synchronous data-parallel step at that time. dstrain's scaling over
                  it is what its own communication and sharing cost.
The table also gives each cell's range over the repetitions: on a shared VM one run can be
30 % off another minutes later, and the range says how far to trust a median.

usage: ddp_compare.py DSTRAIN SRC_DIR WORK_DIR REPS MODE(full|smoke) -- LAUNCHER_PREFIX...
  (the launcher prefix takes the rank count appended: e.g. "mpiexec --oversubscribe -n")
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

# name: preset, sequence length, micro-batch per rank, steps, warm-up steps dropped
CASES = {
    "full": [("tiny", 256, 8, 10, 3), ("small", 512, 1, 7, 2)],
    "smoke": [("tiny", 64, 2, 3, 1)],
}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"ddp_compare: {' '.join(cmd[:6])} ... exited {r.returncode}")
    return r.stdout


def dstrain_rate(dstrain, src, work, data, launch, ranks, preset, seq, micro, steps, warmup):
    out = os.path.join(work, f"dstrain-{preset}-np{ranks}")
    shutil.rmtree(out, ignore_errors=True)
    run([*launch, str(ranks), dstrain, "train", os.path.join(src, "inputs/tiny.yaml"),
         "--set", f"model.preset={preset}", "--set", f"data.train={data}/train.txt",
         "--set", f"data.valid={data}/valid.txt", "--set", "data.text_separator=",
         "--set", f"data.seq_len={seq}", "--set", f"training.micro_batch_size={micro}",
         "--set", f"training.global_batch_size={micro * ranks}",
         "--set", f"training.max_steps={steps}", "--set", "training.schedule.warmup_steps=1",
         "--set", "logging.every_steps=1", "--set", "eval.every_steps=0",
         "--set", "eval.batches=1", "--set", "debug.consistency_every=0",
         "--set", f"run.output_dir={out}"])
    recs = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if x.strip()]
    header = next(x for x in recs if x["type"] == "header")
    rates = [x["tokens_per_s"] for x in recs if x["type"] == "step" and x["step"] > warmup]
    last = [x for x in recs if x["type"] == "phases"][-1]
    straggle = {
        "ratio": last["work_ms_max"] / last["work_ms_min"] if last["work_ms_min"] > 0 else 1.0,
        "apart": last.get("straggle_ms", 0.0) / last["step_ms"] if last["step_ms"] > 0 else 0.0,
        "tail_ms": last["comm_exposed_ms"] - last.get("comm_peer_wait_ms", 0.0),
    }
    return statistics.median(rates), header["peak_gflops_per_rank"], straggle


def ddp_rate(py, here, ranks, preset, seq, micro, steps, warmup):
    out = run([py, os.path.join(here, "ddp_reference.py"), "--preset", preset, "--ranks",
               str(ranks), "--micro", str(micro), "--seq", str(seq), "--steps",
               str(steps - warmup), "--warmup", str(warmup)])
    rec = json.loads(out.strip().splitlines()[-1])
    return rec["tokens_per_s"], rec["flops_per_token"]


def built_benchmark(dstrain, folder, name):
    """Path of benchmark `name` in `folder` of the build the dstrain binary is in (BUILD/bin/
    dstrain -> BUILD/benchmarks/FOLDER/NAME), or None when that build has no such benchmark."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(dstrain)))
    bench = os.path.join(build, "benchmarks", folder, name)
    return bench if os.path.exists(bench) else None


def concurrent_sgemm_peak(dstrain, ranks):
    """Median single-thread SGEMM 2048^3 GFLOP/s per process while `ranks` processes run it
    at once (blas_sgemm_benchmark next to the dstrain binary's build), or None without it.
    The cores of a VM share caches, memory and the host's turbo budget: what each of them
    sustains while all compute is what a run on all of them could reach, and is below what
    one core measures alone (the peak dstrain logs)."""
    bench = built_benchmark(dstrain, "blas", "blas_sgemm_benchmark")
    if bench is None:
        return None
    cmd = [bench, "--benchmark_filter=BM_sgemm/M:2048/N:2048/K:2048", "--benchmark_format=json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(ranks)]
    rates = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"ddp_compare: {bench} exited {p.returncode}")
        # The benchmark reports its repetitions' aggregates only; its counter is in GFLOP/s.
        rates += [b["GFLOPS"] for b in json.loads(out)["benchmarks"]
                  if b.get("aggregate_name") == "median"]
    if len(rates) != ranks:
        raise SystemExit(f"ddp_compare: {bench} gave {len(rates)} medians for {ranks} processes")
    return statistics.median(rates)


def sync_ceiling(dstrain, launch, mode):
    """(scaling, straggle) of training_sync_ceiling_benchmark on 2 ranks with `launch`, or
    None when the benchmark was not built beside the dstrain binary."""
    bench = built_benchmark(dstrain, "training", "training_sync_ceiling_benchmark")
    if bench is None:
        return None
    case = "tokens:2048/layers:4" if mode == "full" else "tokens:64/layers:1"
    out = run([*launch, "2", bench, f"--benchmark_filter=BM_sync_ceiling/{case}/",
               "--benchmark_format=json"])
    got = [b for b in json.loads(out)["benchmarks"] if b["name"].startswith("BM_sync_ceiling")]
    if len(got) != 1:
        raise SystemExit(f"ddp_compare: {bench} reported {len(got)} results, expected 1")
    return got[0]["scaling"], got[0]["straggle"]


def main():
    sep = sys.argv.index("--")
    dstrain, src, work, reps, mode = sys.argv[1:sep]
    launch = sys.argv[sep + 1:]
    reps = int(reps)
    here = os.path.dirname(os.path.abspath(__file__))
    py = sys.executable
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data")
    run([py, os.path.join(src, "tests/e2e/training/synthetic_language.py"), "generate", data,
         "--seq-len", "512", "--train-samples", "64", "--valid-samples", "2"])
    rows, peaks, together, straggles, ceilings = [], [], [], {}, {}
    for preset, seq, micro, steps, warmup in CASES[mode]:
        got = {k: [] for k in ("d1", "d2", "p1", "p2")}
        # MFU of each run against the peak measured seconds from it (PyTorch's: that of the
        # dstrain run just before it, same rank count): the VM's speed drifts between
        # repetitions, and a rate and a peak measured together drift together.
        near = {k: [] for k in got}
        fpt = None
        for rep in range(reps):
            for ranks in (2, 1):
                r, peak, straggle = dstrain_rate(dstrain, src, work, data, launch, ranks, preset,
                                                 seq, micro, steps, warmup)
                got[f"d{ranks}"].append(r)
                if ranks == 2:
                    straggles.setdefault(preset, []).append(straggle)
                peaks.append(peak)
                run_peak = peak
                r, fpt = ddp_rate(py, here, ranks, preset, seq, micro, steps, warmup)
                got[f"p{ranks}"].append(r)
                for key in ("d", "p"):
                    near[f"{key}{ranks}"].append(fpt * got[f"{key}{ranks}"][-1] / 1e9 /
                                                 (run_peak * ranks))
            both = concurrent_sgemm_peak(dstrain, 2)  # sampled as often as the runs' peaks
            if both is not None:
                together.append(both)
            ceiling = sync_ceiling(dstrain, launch, mode)
            if ceiling is not None:
                ceilings.setdefault(preset, []).append(ceiling)
            print(f"  {preset} rep {rep + 1}/{reps}: " +
                  ", ".join(f"{k} {v[-1]:.0f} tok/s" for k, v in got.items()) +
                  f"; d2 straggle {straggles[preset][-1]['ratio']:.2f}, step by step "
                  f"{100 * straggles[preset][-1]['apart']:.1f}% of the step apart, tail "
                  f"{straggles[preset][-1]['tail_ms']:.2f} ms" +
                  (f"; host's synchronous ceiling {100 * ceiling[0]:.1f}% "
                   f"(straggle {ceiling[1]:.2f})" if ceiling is not None else ""),
                  flush=True)
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append((preset, seq, micro, fpt, med, got, near))
    peak = statistics.median(peaks)
    print(f"\nSGEMM peak (median of {len(peaks)} dstrain start-up measurements): {peak:.1f} "
          f"GFLOP/s per core")
    if together:
        print(f"SGEMM rate per core with 2 running at once (median of {len(together)}, one per "
              f"repetition): {statistics.median(together):.1f} GFLOP/s "
              f"({100 * statistics.median(together) / peak:.0f}% of one alone)")
        together = statistics.median(together)
    else:
        together = None
    print(f"medians of {reps} repetitions; tokens/s of all ranks together; MFU vs peak x ranks")
    print("MFU: against the median peak; MFU near: median of each run's MFU against the peak "
          "measured in the same (dstrain) or the adjacent dstrain run (PyTorch)")
    print("| model | seq x micro/rank | implementation | ranks | tokens/s | min-max | model GFLOP/s "
          "| MFU | MFU near |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    summary = []
    for preset, seq, micro, fpt, med, got, near in rows:
        for impl, key in (("dstrain", "d"), ("PyTorch DDP (gloo)", "p")):
            for ranks in (1, 2):
                tps = med[f"{key}{ranks}"]
                g = fpt * tps / 1e9
                runs = got[f"{key}{ranks}"]
                print(f"| {preset} | {seq} x {micro} | {impl} | {ranks} | {tps:.0f} | "
                      f"{min(runs):.0f}-{max(runs):.0f} | {g:.1f} | {100 * g / (peak * ranks):.1f}% | "
                      f"{100 * statistics.median(near[f'{key}{ranks}']):.1f}% |")
        speedup = med["d2"] / med["p2"]
        scaling = med["d2"] / (2 * med["d1"])
        ddp_scaling = med["p2"] / (2 * med["p1"])
        mfu2 = fpt * med["d2"] / 1e9 / (2 * peak)
        of = straggles[preset]
        med_of = lambda k: statistics.median(x[k] for x in of)  # noqa: E731
        lo_of = lambda k: min(x[k] for x in of)  # noqa: E731
        hi_of = lambda k: max(x[k] for x in of)  # noqa: E731
        vs_together = (f" ({100 * mfu2 * peak / together:.1f}% of the 2-at-once SGEMM rate)"
                       if together else "")
        summary.append(f"{preset}: dstrain/DDP at 2 ranks {speedup:.2f}x; dstrain MFU at 2 ranks "
                       f"{100 * mfu2:.1f}%{vs_together}, near {100 * statistics.median(near['d2']):.1f}%"
                       f"; 1->2 scaling efficiency dstrain "
                       f"{100 * scaling:.1f}%, DDP {100 * ddp_scaling:.1f}%; dstrain's 2-rank "
                       f"straggle {med_of('ratio'):.2f} ({lo_of('ratio'):.2f}-{hi_of('ratio'):.2f})"
                       f", step by step {100 * med_of('apart'):.1f}% of the step apart "
                       f"({100 * lo_of('apart'):.1f}-{100 * hi_of('apart'):.1f}%), the sums' tail "
                       f"{med_of('tail_ms'):.2f} ms ({lo_of('tail_ms'):.2f}-{hi_of('tail_ms'):.2f})")
        if preset in ceilings:
            cs = [c[0] for c in ceilings[preset]]
            ceiling_med = statistics.median(cs)
            summary.append(f"{preset}: the host's synchronous 1->2 ceiling (no communication) "
                           f"{100 * ceiling_med:.1f}% ({100 * min(cs):.1f}-{100 * max(cs):.1f}%), "
                           f"straggle {statistics.median(c[1] for c in ceilings[preset]):.2f}; "
                           f"dstrain's scaling is {100 * scaling / ceiling_med:.1f}% of it")
    print("\n" + "\n".join(summary))
    # A model rate above the peak means the start-up peaks of this run were measured in
    # slow minutes (the host's speed drifts): MFU against their median overstates.
    over = [f"{preset} {key}{ranks}" for preset, seq, micro, fpt, med, got, near in rows
            for key in ("d", "p") for ranks in (1, 2)
            if fpt * med[f"{key}{ranks}"] / 1e9 > peak * ranks]
    if over:
        print(f"warning: {', '.join(over)} ran faster than the median peak x ranks: this run's "
              "peak is too low to be the machine's; read the MFU near column")
    print("ddp compare: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
