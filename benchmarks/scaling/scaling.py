#!/usr/bin/env python3
"""Scaling campaign for dstrain: strong and weak scaling of one deck over rank counts.

Strong scaling keeps the global batch fixed (--global-batch sequences per step, split
over the ranks); weak scaling keeps the batch per rank fixed (global = --per-rank-batch
x ranks). Every run trains --steps optimizer steps with every step logged; the first
--warmup steps (start-up, first-touch allocation, cold caches) are left out, and the
median tokens/s of the others is the run's throughput (docs/metrics.md, `step` records).

    scaling.py --dstrain build/cpu-release/bin/dstrain --deck inputs/tiny.yaml \\
        --ranks 1 2 4 --out runs/scaling [--set key=value ...]
    scaling.py ... --slurm --tasks-per-node 8 --ranks 8 16 32   # via slurm/scaling.sbatch
    scaling.py ... --collect-only                                # CSV and plot again

Writes OUT/runs/<mode>-r<ranks>/ (one run directory each, with stdout.log), OUT/scaling.csv
(mode, ranks, nodes, batch, tokens/s median, speedup, efficiency, ...) and OUT/scaling.png
(throughput and efficiency against ranks, with the ideal lines). Efficiency is
(tokens/s at n ranks / tokens/s at the smallest count b) / (n / b): for strong scaling the
speedup over the ideal one, for weak scaling the throughput per rank kept; 1 is ideal.
The plot needs matplotlib (in the oracle environment, scripts/setup-oracles).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[2]
DEFAULT_LAUNCHER = "mpiexec --oversubscribe -n {ranks}"
CSV_FIELDS = ["mode", "ranks", "nodes", "global_batch", "micro_batch", "grad_accum",
              "tokens_per_step", "steps_measured", "tokens_per_s_median", "tokens_per_s_per_rank",
              "step_ms_median", "speedup", "efficiency"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dstrain", default=str(SOURCE_DIR / "build/cpu-release/bin/dstrain"),
                   help="the dstrain binary (default: %(default)s)")
    p.add_argument("--deck", default=str(SOURCE_DIR / "inputs/tiny.yaml"), help="the run deck")
    p.add_argument("--out", required=True, type=Path, help="campaign directory")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="rank counts")
    p.add_argument("--modes", nargs="+", choices=["strong", "weak"], default=["strong", "weak"])
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--global-batch", type=int, default=16, help="strong scaling: sequences per step")
    p.add_argument("--per-rank-batch", type=int, default=4, help="weak scaling: sequences per rank per step")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per rank per micro-step")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="deck override for every run (repeatable), e.g. data.seq_len=64")
    p.add_argument("--launcher", default=DEFAULT_LAUNCHER,
                   help="local launch command, {ranks} replaced (default: %(default)r)")
    p.add_argument("--collect-only", action="store_true", help="only read the runs in OUT/runs")
    p.add_argument("--no-plot", action="store_true", help="write the CSV only")
    s = p.add_argument_group("Slurm (slurm/scaling.sbatch, one array task per rank count)")
    s.add_argument("--slurm", action="store_true", help="submit the runs with sbatch instead of running them")
    s.add_argument("--tasks-per-node", type=int, default=1, help="ranks per node (nodes = ranks / this)")
    s.add_argument("--sbatch", default="sbatch", help="the sbatch command (default: %(default)s)")
    s.add_argument("--script", default=str(SOURCE_DIR / "slurm/scaling.sbatch"), help="the array script")
    s.add_argument("--sbatch-args", default="", help="more sbatch options, e.g. '--partition=gpu --time=0:20:00'")
    s.add_argument("--wait", action="store_true",
                   help="wait for the jobs (sbatch --wait), then collect; otherwise rerun with --collect-only")
    a = p.parse_args(argv)
    a.ranks = sorted(set(a.ranks))
    if a.warmup >= a.steps:
        p.error(f"--warmup ({a.warmup}) must be less than --steps ({a.steps}): no step would be measured")
    return a


def global_batch(args: argparse.Namespace, mode: str, ranks: int) -> int:
    return args.global_batch if mode == "strong" else args.per_rank_batch * ranks


def check_batches(args: argparse.Namespace) -> None:
    """dstrain refuses a global batch that is not micro-batch x ranks x accumulation."""
    bad = []
    for mode in args.modes:
        for n in args.ranks:
            g = global_batch(args, mode, n)
            if g % (args.micro_batch * n):
                bad.append(f"{mode} at {n} ranks: global batch {g} is not a multiple of "
                           f"--micro-batch {args.micro_batch} x {n} ranks")
            if args.slurm and n % args.tasks_per_node:
                bad.append(f"{n} ranks is not a whole number of nodes of {args.tasks_per_node} ranks")
    if bad:
        sys.exit("scaling: " + "; ".join(bad))


def run_dir(args: argparse.Namespace, mode: str, ranks: int) -> Path:
    return args.out / "runs" / f"{mode}-r{ranks}"  # the naming slurm/scaling.sbatch uses


def dstrain_args(args: argparse.Namespace, mode: str, ranks: int) -> list[str]:
    """The same settings as slurm/scaling.sbatch: the user's first, the campaign's win."""
    out = [a for kv in args.sets for a in ("--set", kv)]
    for kv in (f"run.output_dir={run_dir(args, mode, ranks)}", f"training.max_steps={args.steps}",
               f"training.global_batch_size={global_batch(args, mode, ranks)}",
               f"training.micro_batch_size={args.micro_batch}", "logging.every_steps=1",
               "checkpoint.every_steps=0", "checkpoint.resume=none", "eval.every_steps=0"):
        out += ["--set", kv]
    return out


def run_local(args: argparse.Namespace) -> None:
    for mode in args.modes:
        for n in args.ranks:
            d = run_dir(args, mode, n)
            if d.exists():
                for f in d.iterdir():  # a measurement starts fresh
                    if f.is_file():
                        f.unlink()
            d.mkdir(parents=True, exist_ok=True)
            cmd = (shlex.split(args.launcher.format(ranks=n)) + [args.dstrain, "train", args.deck]
                   + dstrain_args(args, mode, n))
            print(f"scaling: {mode}, {n} rank(s), global batch {global_batch(args, mode, n)}: "
                  f"{shlex.join(cmd)}", flush=True)
            t0 = time.monotonic()
            with open(d / "stdout.log", "w") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                tail = (d / "stdout.log").read_text(errors="replace").splitlines()[-20:]
                sys.exit(f"scaling: {mode} at {n} ranks failed (exit {rc}); last lines of "
                         f"{d / 'stdout.log'}:\n" + "\n".join(tail))
            print(f"scaling:   done in {time.monotonic() - t0:.1f} s", flush=True)


def submit_slurm(args: argparse.Namespace) -> None:
    env = dict(os.environ, NODE_COUNTS=" ".join(str(n // args.tasks_per_node) for n in args.ranks),
               TASKS_PER_NODE=str(args.tasks_per_node), MODES=" ".join(args.modes),
               STEPS=str(args.steps), GLOBAL_BATCH=str(args.global_batch),
               PER_RANK_BATCH=str(args.per_rank_batch), MICRO_BATCH=str(args.micro_batch),
               CAMPAIGN_DIR=str((args.out / "runs").resolve()), DECK=args.deck,
               DSTRAIN=str(Path(args.dstrain).resolve()))
    user = [a for kv in args.sets for a in ("--set", kv)]
    procs = []
    for i, n in enumerate(args.ranks):  # one array task per count, each with its own node count
        cmd = ([args.sbatch, "--parsable", f"--array={i}", f"--nodes={n // args.tasks_per_node}",
                f"--ntasks-per-node={args.tasks_per_node}"] + shlex.split(args.sbatch_args)
               + (["--wait"] if args.wait else []) + [args.script] + user)
        print(f"scaling: submitting {n} ranks: {shlex.join(cmd)}", flush=True)
        procs.append((n, subprocess.Popen(cmd, env=env)))
    failed = [n for n, p in procs if p.wait() != 0]
    if failed:
        sys.exit(f"scaling: the jobs for {failed} ranks failed")
    if not args.wait:
        print("scaling: submitted; when the jobs have finished, run again with --collect-only")
        sys.exit(0)


def read_run(d: Path, ranks: int, warmup: int) -> dict:
    path = d / "metrics.jsonl"
    if not path.exists():
        sys.exit(f"scaling: {path} is missing (did the run fail? see {d / 'stdout.log'})")
    header, steps = None, []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec["type"] == "header":
                header, steps = rec, []  # the last run in the directory counts
            elif rec["type"] == "step":
                steps.append(rec)
    if header is None or header["world_size"] != ranks:
        sys.exit(f"scaling: {path}: expected a run on {ranks} ranks, the header says "
                 f"{None if header is None else header['world_size']}")
    measured = [s for s in steps if s["step"] > warmup and not s.get("skipped")]
    if not measured:
        sys.exit(f"scaling: {path}: no step after the {warmup} warm-up steps")
    return {"tokens_per_step": measured[-1]["tokens"],
            "steps_measured": len(measured),
            "tokens_per_s_median": statistics.median(s["tokens_per_s"] for s in measured),
            "step_ms_median": statistics.median(s["step_ms"] for s in measured)}


def collect(args: argparse.Namespace) -> list[dict]:
    rows = []
    for mode in args.modes:
        base = None
        for n in args.ranks:
            r = read_run(run_dir(args, mode, n), n, args.warmup)
            g = global_batch(args, mode, n)
            if base is None:
                base = (n, r["tokens_per_s_median"])
            speedup = r["tokens_per_s_median"] / base[1]
            rows.append({"mode": mode, "ranks": n,
                         "nodes": n // args.tasks_per_node if args.slurm else 1,
                         "global_batch": g, "micro_batch": args.micro_batch,
                         "grad_accum": g // (args.micro_batch * n), **r,
                         "tokens_per_s_per_rank": r["tokens_per_s_median"] / n,
                         "speedup": speedup, "efficiency": speedup / (n / base[0])})
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    for color, mode in zip(("C0", "C1"), sorted({r["mode"] for r in rows}, key=["strong", "weak"].index)):
        rs = [r for r in rows if r["mode"] == mode]
        n = [r["ranks"] for r in rs]
        t = [r["tokens_per_s_median"] for r in rs]
        ideal = [t[0] * k / n[0] for k in n]
        ax_t.plot(n, t, "o-", color=color, label=f"{mode} scaling")
        ax_t.plot(n, ideal, "--", color=color, alpha=0.6, label=f"{mode}: ideal")
        ax_e.plot(n, [r["efficiency"] for r in rs], "o-", color=color, label=f"{mode} scaling")
    ranks = sorted({r["ranks"] for r in rows})
    ax_e.axhline(1.0, color="gray", linestyle="--", label="ideal")
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks)
        ax.set_xticklabels([str(k) for k in ranks])
        ax.set_xlabel("MPI ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_ylabel("tokens/s (median over measured steps)")
    ax_t.set_title("throughput")
    ax_e.set_ylabel("parallel efficiency")
    ax_e.set_ylim(0, max(1.1, max(r["efficiency"] for r in rows) * 1.1))
    ax_e.set_title("efficiency (1 = ideal)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    check_batches(args)
    # Other work on the machine skews the figures: say how busy it was (local runs).
    machine = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start"
    if not args.collect_only:
        if args.slurm:
            submit_slurm(args)
        else:
            run_local(args)
    rows = collect(args)
    write_csv(rows, args.out / "scaling.csv")
    print("\n| mode | ranks | global batch | tokens/s (median) | per rank | step ms | speedup | efficiency |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['ranks']} | {r['global_batch']} | {r['tokens_per_s_median']:.0f} | "
              f"{r['tokens_per_s_per_rank']:.0f} | {r['step_ms_median']:.1f} | {r['speedup']:.2f} | "
              f"{r['efficiency']:.2f} |")
    print(f"\nscaling: wrote {args.out / 'scaling.csv'}" + ("" if args.slurm else f" ({machine})"))
    if not args.no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("scaling: matplotlib is not installed: no plot (pip install matplotlib, or use the "
                  "oracle environment of scripts/setup-oracles; --no-plot skips it)", file=sys.stderr)
            return 3
        title = (f"dstrain {Path(args.deck).name}: {args.steps} steps, median of steps > {args.warmup}; "
                 f"strong: global batch {args.global_batch}, weak: {args.per_rank_batch} per rank"
                 + ("" if args.slurm or args.collect_only else f"\n{machine}"))
        plot(rows, args.out / "scaling.png", title)
        print(f"scaling: wrote {args.out / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
