"""What the multi-rank training scripts of this folder share (rank_invariance.py,
zero_stages.py, pipeline.py, expert_parallel.py): their command line, a fresh work folder
with the synthetic corpus, and the comparisons of parameters."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import h5py
import numpy as np


# Every collective's deadline in these runs (the deck's is 600 s, CTest's limit for a whole
# script): a hung run ends with the rank, the operation and the cause well inside the limit.
# A tiny-model step takes well under a second, even on oversubscribed cores.
DEADLINE_S = 90
# A run still going this long after its start has outlived its deadlines: it is killed and
# named.
KILL_AFTER_S = 240
# The per-rank peak every run states (logging.peak_gflops), whose metrics header must say it.
PEAK_GFLOPS = 100.0
# The tiny preset's own widths, which the scripts' deck (tests/e2e/decks/narrow.yaml)
# halves: the runs whose bounds were set at them state these.
TINY_WIDTHS = ["model.d_model=256", "model.ffn_dim=688"]


def deck_width(deck):
    """The d_model the deck file gives (its model section's `d_model:`), else the tiny
    preset's 256."""
    with open(deck) as f:
        m = re.search(r"^\s+d_model:\s*(\d+)", f.read(), re.MULTILINE)
    return int(m.group(1)) if m else 256


@dataclass
class Setup:
    dstrain: str
    deck: str
    work: str
    data: str  # the corpus folder: train.txt, valid.txt
    launch: list  # mpiexec, its process-count flag; the count follows, then preflags
    preflags: list
    extra: list = field(default_factory=list)  # arguments after the work folder
    # logging.peak_gflops of every run; None: not set (a binary that predates the key)
    peak_gflops: float = PEAK_GFLOPS

    def mpiexec(self, ranks):
        """The launcher's words for `ranks` processes, oversubscribed."""
        return [*self.launch, str(ranks), "--oversubscribe", *self.preflags]

    def train(self, name, ranks, sets, *, seq, micro, global_batch, steps, checkpoint_every=0):
        """`dstrain train` of the deck on `ranks` ranks into WORK/name, on the synthetic
        corpus: samples of `seq` tokens, micro-batch `micro`, `global_batch` sequences a
        step, `steps` steps (2 of warm-up), a metrics line every step, no evaluation but
        the final one, checkpoints every `checkpoint_every` steps (0: the final one), then
        the `sets` ("key=value"). The MFU is reported against a stated peak
        (peak_gflops): no start-up measurement, about a second of rank 0's time a launch
        (the demo and the command-line tests measure it). Returns (the run folder, the
        completed process, seconds)."""
        out = os.path.join(self.work, name)
        cmd = [*self.mpiexec(ranks), self.dstrain, "train", self.deck,
               "--set", f"data.train={self.data}/train.txt",
               "--set", f"data.valid={self.data}/valid.txt",
               "--set", "data.text_separator=", "--set", f"data.seq_len={seq}",
               "--set", f"training.micro_batch_size={micro}",
               "--set", f"training.global_batch_size={global_batch}",
               "--set", f"training.max_steps={steps}", "--set", "training.schedule.warmup_steps=2",
               "--set", "logging.every_steps=1", "--set", "eval.every_steps=0",
               "--set", "eval.batches=1", "--set", f"checkpoint.every_steps={checkpoint_every}",
               "--set", f"run.output_dir={out}", "--set", f"parallel.timeout_s={DEADLINE_S}"]
        if self.peak_gflops is not None:
            cmd += ["--set", f"logging.peak_gflops={self.peak_gflops}"]
        for s in sets:
            cmd += ["--set", s]
        print(f"{name}: {ranks} rank(s) ...", flush=True)
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired as e:
            # The run outlived its own deadlines: show what it said, name it.
            for part in (e.stdout, e.stderr):
                if part:
                    print(part.decode() if isinstance(part, bytes) else part)
            raise SystemExit(f"FAILED: {name} still running after {KILL_AFTER_S} s: killed")
        took = time.monotonic() - t0
        print(f"{name}: exit {r.returncode} after {took:.1f} s", flush=True)
        return out, r, took

    def run(self, name, ranks, sets, layout, **train_args):
        """train() that must exit 0 and log `layout` (else the script ends, printing the log):
        (the run folder, its metrics.jsonl step records, its final-params.h5 tensors)."""
        out, r, _ = self.train(name, ranks, sets, **train_args)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name} exited {r.returncode}")
        if layout not in r.stdout + r.stderr:
            print(r.stdout + r.stderr)
            raise SystemExit(f"FAILED: {name}: the log does not say '{layout}'")
        records, params = read_run(out)
        header = records[0] if records and records[0].get("type") == "header" else {}
        if self.peak_gflops is not None and header.get("peak_gflops_per_rank") != self.peak_gflops:
            raise SystemExit(f"FAILED: {name}: metrics header's peak_gflops_per_rank is "
                             f"{header.get('peak_gflops_per_rank')}, not logging.peak_gflops "
                             f"{self.peak_gflops}")
        return out, [x for x in records if x.get("type") == "step"], params


def setup(seq_len, argv=None):
    """Parses `DSTRAIN DECK GENERATOR WORK [EXTRA...] -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]`,
    empties WORK and writes the synthetic corpus of `seq_len` tokens per sample (256
    training, 8 validation samples) into WORK/data."""
    argv = sys.argv if argv is None else argv
    sep = argv.index("--")
    dstrain, deck, generator, work, *extra = argv[1:sep]
    mpiexec, numproc_flag, *preflags = argv[sep + 1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "data")
    subprocess.run([sys.executable, generator, "generate", data, "--seq-len", str(seq_len),
                    "--train-samples", "256", "--valid-samples", "8"], check=True,
                   capture_output=True)
    return Setup(dstrain, deck, work, data, [mpiexec, numproc_flag], preflags, extra)


def read_run(out):
    """A finished run's metrics.jsonl records and its final-params.h5 tensors by name."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    with h5py.File(os.path.join(out, "final-params.h5"), "r") as f:
        params = {k: np.array(f["params"][k]) for k in f["params"]}
    return records, params


def rel_l2(a, b):
    """||a - b|| / ||b|| in float64 (b's norm floored at 1e-30)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def read_h5(path, prefixes):
    """Every dataset of an HDF5 file whose name starts with one of `prefixes`."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.startswith(prefixes):
                out[name] = np.array(obj)
        f.visititems(visit)
    return out


def same_bits(a, b):
    """The same names holding the same bytes."""
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


class Comparisons:
    """One run against another, collecting what differs in `problems`. A run is what the
    scripts' run() returns after its folder: (steps, params, ...), steps the (step, loss,
    grad_norm) of metrics.jsonl, params final-params.h5's tensors by name."""

    def __init__(self, tol, tensor_tol, steps):
        self.tol = tol                # losses (relative), the whole parameter vector (rel. L2)
        self.tensor_tol = tensor_tol  # each tensor (relative L2)
        self.steps = steps            # the steps a run logs
        self.problems = []

    def same_bits(self, name, a, b, first_step=1):
        """a's steps from first_step and its final parameters are b's, bit for bit."""
        ref_steps = [s for s in b[0] if s[0] >= first_step]
        if a[0] != ref_steps:
            self.problems.append(f"{name}: steps (step, loss, norm) {a[0][:3]}... differ from "
                                 f"{ref_steps[:3]}...")
        differing = [k for k in b[1] if not np.array_equal(a[1].get(k), b[1][k])]
        if sorted(a[1]) != sorted(b[1]) or differing:
            self.problems.append(f"{name}: {len(differing)} tensors differ in final-params.h5"
                                 + (f", first {differing[0]}" if differing else ""))
        else:
            print(f"{name}: bit-identical ({len(a[0])} steps, {len(a[1])} tensors)")

    def hung(self, name, launched, wants, said):
        """A run with a rank hung on purpose (launched: (folder, CompletedProcess, seconds))
        ended with exit 4 within 60 s, its log saying each of `wants`."""
        _, r, took = launched
        text = r.stdout + r.stderr
        missing = [w for w in wants if w not in text]
        if r.returncode != 4 or missing or took > 60:
            print(text)
            self.problems.append(f"{name}: exit {r.returncode} (want 4) after {took:.1f} s "
                                 f"(bound 60 s); missing from the log: {missing}")
        else:
            print(f"{name}: {said}, the job ended in {took:.1f} s")

    def key_within(self, name, a, b, key):
        """The step records a and b (as Setup.run gives them) have `key` within tol of each
        other at every step (relative), and as many steps as a run logs."""
        worst = max((abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b)), default=0.0)
        if len(a) != self.steps or len(b) != self.steps or worst > self.tol:
            self.problems.append(f"{name}: {key} within {worst:.2e} (bound {self.tol:g}) over "
                                 f"{len(a)} steps")
        else:
            print(f"{name}: {key} within {worst:.2e}")

    def within(self, name, a, b, first_step=1, tensor_tol=None):
        """a's losses from first_step within tol of b's (relative), its final parameters
        within tol as one vector and within tensor_tol (this call's, else the object's) each
        (relative L2)."""
        tensor_tol = self.tensor_tol if tensor_tol is None else tensor_tol
        ref = {s[0]: s[1] for s in b[0]}
        worst = 0.0
        checked = 0
        for step, loss, _ in a[0]:
            if step < first_step:
                continue
            checked += 1
            err = abs(loss - ref[step]) / abs(ref[step])
            worst = max(worst, err)
            if err > self.tol:
                self.problems.append(f"{name}: step {step} loss {loss!r} vs {ref[step]!r}")
        if checked < self.steps - first_step + 1:
            self.problems.append(f"{name}: {checked} steps logged")
        if sorted(a[1]) != sorted(b[1]):
            self.problems.append(f"{name}: final-params.h5 holds other tensors "
                                 f"({len(a[1])} vs {len(b[1])})")
            return
        bad = [k for k in b[1] if a[1][k].shape != b[1][k].shape]
        if bad:
            self.problems.append(f"{name}: {bad[0]} has shape {a[1][bad[0]].shape}, "
                                 f"not {b[1][bad[0]].shape}")
            return
        keys = sorted(b[1])
        whole = rel_l2(np.concatenate([a[1][k].ravel() for k in keys]),
                       np.concatenate([b[1][k].ravel() for k in keys]))
        wp, wk = max((rel_l2(a[1][k], b[1][k]), k) for k in keys)
        if whole > self.tol:
            self.problems.append(f"{name}: parameters relative L2 {whole:.2e} > {self.tol:g}")
        if wp > tensor_tol:
            self.problems.append(f"{name}: {wk} relative L2 {wp:.2e} > {tensor_tol:g}")
        print(f"{name}: losses within {worst:.2e}, parameters within {whole:.2e} relative L2 "
              f"(the farthest tensor {wk}: {wp:.2e})")
