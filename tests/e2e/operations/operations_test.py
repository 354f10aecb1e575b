#!/usr/bin/env python3
"""Stop signals, hangs and dying ranks, end to end.

usage: operations_test.py MODE DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]

MODE
  sigusr1      SIGUSR1 to mpirun (which forwards it to every rank) a few steps in, and a
               second one while the checkpoint is being written: exit 7, one committed
               checkpoint of the step it stopped after, and a restart resumes from it.
  sigterm-rank SIGTERM to rank 1 alone: every rank agrees at the next step boundary,
               exit 7, "1 of 2 ranks signalled".
  sigint       SIGINT (a terminal's Ctrl-C) to a single-process run: exit 7, checkpoint.
  hang         debug.inject_hang_rank=1 after the first checkpoint: the job ends within
               parallel.timeout_s + 30 s, the waiting rank's flight record is printed, and
               the last checkpoint still loads.
  hang-alltoallv  debug.inject_hang_alltoallv_rank=1 on tiny-moe at parallel.expert 2:
               rank 1 hangs in the expert all-to-all-v; rank 0's deadline ends the job
               (exit 4) within the same bound, naming the alltoallv on group 'expert'.
  hang-single  the same on a single-process run, where no collective waits: the hang
               watchdog (timeout + 15 s) names what the rank is stuck in and ends it with
               exit 4.
  exit-rank    debug.inject_exit_rank=1: the job ends within the same bound.
  sigkill-rank SIGKILL of rank 1: the job ends within the same bound.

Standard library only. The data: the synthetic language of
tests/e2e/training/synthetic_language.py.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

TIMEOUT_S = 8  # parallel.timeout_s of the hang tests
BOUND_S = TIMEOUT_S + 30


def fail(msg, out=None):
    if out:
        print(out)
    print("FAILED: " + msg)
    sys.exit(1)


class Run:
    """A training job whose output is collected by a thread while the test acts on it."""

    def __init__(self, cmd):
        self.lines = []
        self.t0 = time.time()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    def text(self):
        return "".join(self.lines)

    def wait_for(self, pattern, limit=180):
        deadline = time.time() + limit
        while time.time() < deadline:
            if re.search(pattern, self.text()):
                return
            if self.p.poll() is not None:
                self.reader.join(5)
                if re.search(pattern, self.text()):
                    return
                fail(f"the job ended (exit {self.p.returncode}) before '{pattern}'", self.text())
            time.sleep(0.02)
        self.kill()
        fail(f"no '{pattern}' within {limit} s", self.text())

    def finish(self, limit):
        try:
            rc = self.p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill()
            fail(f"the job did not end within {limit} s", self.text())
        self.reader.join(10)
        return rc, time.time() - self.t0

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def rank_pids(self):
        """The dstrain processes under this job (mpirun's children), in pid order."""
        out = subprocess.run(["pgrep", "-s", str(self.p.pid), "-f", "dstrain train"],
                             stdout=subprocess.PIPE, text=True).stdout.split()
        return sorted(int(x) for x in out if int(x) != self.p.pid)


class Ctx:
    def __init__(self, argv):
        sep = argv.index("--")
        self.mode, self.dstrain, self.deck, self.generator, self.work = argv[1:sep]
        mpiexec, numproc_flag, *preflags = argv[sep + 1:]
        self.mpiexec = [mpiexec, *preflags]
        self.numproc_flag = numproc_flag
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.data = os.path.join(self.work, "data")
        subprocess.run([sys.executable, self.generator, "generate", self.data, "--seq-len", "64",
                        "--train-samples", "512", "--valid-samples", "16"],
                       check=True, stdout=subprocess.DEVNULL)
        self.out_dir = os.path.join(self.work, "run")

    def command(self, ranks, extra, launcher=True):
        args = ["data.train=" + os.path.join(self.data, "train.txt"),
                "data.valid=" + os.path.join(self.data, "valid.txt"), "data.text_separator=",
                "data.seq_len=64", "training.micro_batch_size=2", "training.global_batch_size=4",
                "training.max_steps=400", "training.schedule.warmup_steps=2",
                "logging.every_steps=1", "eval.every_steps=0", "eval.batches=1",
                "checkpoint.every_steps=0", "run.output_dir=" + self.out_dir,
                # the tiny preset narrowed: the behaviour tested does not depend on size
                "model.d_model=128", "model.n_layers=2", "model.ffn_dim=344",
                # a stated peak for the MFU: no start-up measurement in each launch
                "logging.peak_gflops=100"] + list(extra)
        cmd = [self.dstrain, "train", self.deck]
        if launcher:
            cmd = [*self.mpiexec, self.numproc_flag, str(ranks)] + cmd
        for a in args:
            cmd += ["--set", a]
        return cmd

    def checkpoint(self, step):
        return os.path.join(self.out_dir, "checkpoints", f"step-{step}.h5")

    def resume_check(self, ranks, step, launcher=True):
        """Resumes from step-<step>.h5 for 3 more steps (training.stop_at_step: the
        schedule still runs to max_steps), and checks that the resumed process starts at
        step + 1 and ends bit-identical to a run of the same deck that never stopped:
        the same loss text in metrics.jsonl for those steps, and the same checksum for
        every tensor of the final checkpoint (`dstrain inspect`)."""
        stop = step + 3
        extra = [f"training.stop_at_step={stop}"]
        p = subprocess.run(self.command(ranks, extra, launcher), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=180)
        want = f"resumed from {self.checkpoint(step)} at step {step}"
        if p.returncode != 0 or want not in p.stdout:
            fail(f"the restart did not resume from step {step} (exit {p.returncode})", p.stdout)
        steps = [int(m) for m in re.findall(r"step +(\d+)/\d+ \|", p.stdout)]
        if steps != list(range(step + 1, stop + 1)):
            fail(f"the resumed process ran steps {steps}, expected {step + 1}..{stop}", p.stdout)
        resumed_dir = self.out_dir
        self.out_dir = os.path.join(self.work, "straight")
        try:
            q = subprocess.run(self.command(ranks, extra, launcher), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=300)
            if q.returncode != 0:
                fail(f"the uninterrupted run failed (exit {q.returncode})", q.stdout)
            straight_dir = self.out_dir
        finally:
            self.out_dir = resumed_dir
        a, b = losses(resumed_dir), losses(straight_dir)
        for s in range(step + 1, stop + 1):
            if a.get(s) is None or a.get(s) != b.get(s):
                fail(f"loss at step {s}: {a.get(s)} after the resume, {b.get(s)} uninterrupted")
        ta, tb = (self.tensor_table(os.path.join(d, "checkpoints", f"step-{stop}.h5"))
                  for d in (resumed_dir, straight_dir))
        if not ta or ta != tb:
            fail("the final checkpoints' tensor checksums differ from the uninterrupted run's")

    def tensor_table(self, path):
        out = subprocess.run([self.dstrain, "inspect", path, "--no-verify"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=120).stdout
        return re.findall(r"^ +((?:params|optimizer)/\S+) .* ([0-9a-f]{16}) ", out, re.M)


def losses(run_dir):
    """{step: the loss as printed in metrics.jsonl} (the text: bit equality)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if '"type":"step"' in line:
                step = int(re.search(r'"step":(\d+)', line).group(1))
                out[step] = re.search(r'"loss":([^,}]*)', line).group(1)
    return out


def stopped_step(out):
    m = re.search(r"stopped after step (\d+) of \d+ on request; checkpoint committed; exit code 7",
                  out)
    if not m:
        fail("no 'stopped after step N ... on request' line", out)
    return int(m.group(1))


def mode_sigusr1(c):
    r = Run(c.command(2, []))
    r.wait_for(r"step +3/400 \|")
    os.kill(r.p.pid, signal.SIGUSR1)
    r.wait_for(r"saving a checkpoint")
    os.kill(r.p.pid, signal.SIGUSR1)  # a second signal while the checkpoint is written
    rc, _ = r.finish(120)
    out = r.text()
    if rc != 7:
        fail(f"exit code {rc}, expected 7 (preempted)", out)
    step = stopped_step(out)
    if "SIGUSR1 on this rank, 2 of 2 ranks signalled" not in out:
        fail("the stop line should say SIGUSR1 reached both ranks", out)
    c.resume_check(2, step)
    print(f"SIGUSR1 through mpirun: stopped after step {step} with exit 7, the second signal "
          "during the save did no harm, the restart resumed from it bit-identically")


def mode_sigterm_rank(c):
    r = Run(c.command(2, []))
    r.wait_for(r"step +3/400 \|")
    pids = r.rank_pids()
    if len(pids) != 2:
        r.kill()
        fail(f"expected 2 rank processes, found {pids}")
    os.kill(pids[1], signal.SIGTERM)
    rc, _ = r.finish(120)
    out = r.text()
    if rc != 7:
        fail(f"exit code {rc}, expected 7", out)
    step = stopped_step(out)
    if "1 of 2 ranks signalled" not in out:
        fail("the stop line should say 1 of 2 ranks was signalled", out)
    c.resume_check(2, step)
    print(f"SIGTERM to one rank: both ranks stopped after step {step} with exit 7")


def mode_sigint(c):
    r = Run(c.command(1, [], launcher=False))
    r.wait_for(r"step +3/400 \|")
    os.kill(r.p.pid, signal.SIGINT)
    rc, _ = r.finish(120)
    out = r.text()
    if rc != 7:
        fail(f"exit code {rc}, expected 7", out)
    step = stopped_step(out)
    c.resume_check(1, step, launcher=False)
    print(f"SIGINT to a single-process run: stopped after step {step} with exit 7, resumed "
          "bit-identically")


def expect_all(out, patterns):
    for want in patterns:
        if not re.search(want, out):
            fail(f"no '{want}' in the output", out)


def ends_within_bound(c, extra, what, ranks=2, launcher=True):
    r = Run(c.command(ranks, [f"parallel.timeout_s={TIMEOUT_S}", "checkpoint.every_steps=2"] +
                      extra, launcher))
    if what == "sigkill":
        r.wait_for(r"checkpoint: .*step-2\.h5")
        r.wait_for(r"step +4/400 \|")
        pids = r.rank_pids()
        os.kill(pids[1], signal.SIGKILL)
        t_fault = time.time()
    else:
        r.wait_for(r"debug\.inject_(hang|exit|hang_alltoallv)_rank: ")
        t_fault = time.time()
    rc, _ = r.finish(BOUND_S + 30)
    took = time.time() - t_fault
    out = r.text()
    if rc == 0:
        fail("the job exited 0 after a fault", out)
    if took > BOUND_S:
        fail(f"the job took {took:.0f} s after the fault, more than timeout + 30 = {BOUND_S} s", out)
    return rc, took, out


def mode_hang(c):
    rc, took, out = ends_within_bound(c, ["debug.inject_hang_rank=1"], "hang")
    expect_all(out, (r"\[rank 0\] error: .*did not complete within 8 s",
                     r"recent operations on rank 0 \(flight recorder",
                     r"IN FLIGHT"))
    c.resume_check(2, 2)
    print(f"hang on rank 1: the job ended {took:.0f} s after the hang (exit {rc}), rank 0 "
          "printed its flight record, step-2.h5 still loads")


def mode_hang_alltoallv(c):
    rc, took, out = ends_within_bound(
        c, ["debug.inject_hang_alltoallv_rank=1", "model.preset=tiny-moe", "parallel.expert=2",
            "parallel.backend=mpi"], "hang")
    if rc != 4:
        fail(f"exit {rc}; expected 4 (a collective's deadline)", out)
    expect_all(out, (r"\[rank 0\] error: .*alltoallv of \d+ x f32 .* on group 'expert' \(2 ranks\)"
                     r".*did not complete within 8 s",
                     r"recent operations on rank 0 \(flight recorder",
                     r"IN FLIGHT"))
    print(f"hang in the expert all-to-all-v on rank 1: the job ended {took:.0f} s after the hang "
          f"(exit {rc}), rank 0 named the alltoallv")


def mode_hang_single(c):
    rc, took, out = ends_within_bound(c, ["debug.inject_hang_rank=0"], "hang", ranks=1,
                                      launcher=False)
    if rc != 4:
        fail(f"exit {rc}; expected 4 (timeout)", out)
    expect_all(out, (r"error: no progress for \d+ s \(parallel\.timeout_s 8 \+ 15 s\) at step 3: "
                     r"stuck in debug\.inject_hang_rank: a deliberate hang",
                     r"recent operations on this rank \(flight recorder"))
    c.resume_check(1, 2)
    print(f"hang on a single rank: the watchdog ended it {took:.0f} s after the hang (exit 4), "
          "naming the stuck operation; step-2.h5 still loads")


def mode_exit_rank(c):
    rc, took, out = ends_within_bound(c, ["debug.inject_exit_rank=1"], "exit")
    print(f"rank 1 exited: the job ended {took:.0f} s later (exit {rc})")


def mode_sigkill_rank(c):
    rc, took, out = ends_within_bound(c, [], "sigkill")
    print(f"rank 1 SIGKILLed: the job ended {took:.0f} s later (exit {rc})")


def main():
    c = Ctx(sys.argv)
    fn = globals().get("mode_" + c.mode.replace("-", "_"))
    if not fn:
        fail("unknown mode " + c.mode)
    fn(c)


if __name__ == "__main__":
    main()
