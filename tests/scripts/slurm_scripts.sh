#!/usr/bin/env bash
# Runs the Slurm job scripts (slurm/*.sbatch) on this machine through the fake Slurm
# commands in tests/scripts/fake-slurm (sbatch runs the script now with SLURM_* set;
# srun becomes mpiexec; scontrol records requeues), with the real dstrain binary on the
# tiny deck and a slice of the demo corpus as text:
#   slurm_scripts.sh MODE DSTRAIN SOURCE_DIR WORK_DIR
# MODE: single-node | multi-node | scaling | preempt-logic | preempt
set -euo pipefail
mode=$1 dstrain=$2 src=$3 work=$(readlink -m "$4")
fake=$src/tests/scripts/fake-slurm
work=$work/$mode
rm -rf "$work"
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
data=$(cd "$work/data" && pwd)
cd "$work"  # the submit directory: runs/ lands here
export FAKE_SLURM_LOG=$work/slurm.log FAKE_SLURM_STATE=$work/state
export DSTRAIN=$dstrain DECK=$src/inputs/tiny.yaml
small=(--set "data.train=$data/fortunes-train.txt" --set "data.valid=$data/fortunes-valid.txt"
       --set data.seq_len=64 --set training.micro_batch_size=2 --set training.global_batch_size=8
       --set training.schedule.warmup_steps=1 --set logging.every_steps=1 --set eval.batches=2)

fail() { echo "slurm $mode: FAILED: $*" >&2; exit 1; }
steps_in() { grep -c '"type":"step"' "$1/metrics.jsonl"; }
expect_rc() {  # expect_rc WANT COMMAND...: runs COMMAND (output to the test log)
  local want=$1 rc=0; shift
  "$@" || rc=$?
  [[ $rc == "$want" ]] || fail "expected exit $want from '$*', got $rc"
}

case "$mode" in
  single-node)
    # CPU: 2 ranks on one node; the run directory is named by the job id.
    expect_rc 0 "$fake/sbatch" --ntasks-per-node=2 --cpus-per-task=1 "$src/slurm/single-node.sbatch" \
      "${small[@]}" --set training.max_steps=3
    run=$work/runs/dstrain-4242
    [[ $(steps_in "$run") == 3 ]] || fail "expected 3 step records in $run/metrics.jsonl"
    grep -q '"world_size":2' "$run/metrics.jsonl" || fail "metrics header does not say 2 ranks"
    grep -q -- "srun ntasks=2 nodes=1: $dstrain train $DECK --set run.output_dir=$run" slurm.log ||
      fail "srun was not given the run directory"
    # `check` instead of `train`, and the GPU variant refuses an allocation without GPUs.
    SUBCOMMAND=check expect_rc 0 "$fake/sbatch" --ntasks-per-node=1 "$src/slurm/single-node.sbatch"
    env -u CUDA_VISIBLE_DEVICES DEVICE=gpu DSTRAIN=/bin/true \
      "$fake/sbatch" --ntasks-per-node=1 "$src/slurm/single-node.sbatch" > gpu.log 2>&1 && fail "DEVICE=gpu without GPUs ran"
    grep -q "the allocation has no GPUs" gpu.log || fail "DEVICE=gpu without GPUs: no message"
    echo "slurm single-node: ok" ;;

  multi-node)
    # 2 nodes x 1 task: `check` on the allocation, then `train`.
    FAKE_SLURM_JOB_ID=5151 expect_rc 0 "$fake/sbatch" --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 \
      "$src/slurm/multi-node.sbatch" "${small[@]}" --set training.max_steps=3
    run=$work/runs/dstrain-5151
    [[ $(grep -c '^srun ntasks=2 nodes=2: ' slurm.log) == 2 ]] || fail "expected two 2-rank steps (check, train)"
    grep -q " check $DECK --set run.output_dir=$run" slurm.log || fail "no check step"
    [[ $(steps_in "$run") == 3 ]] || fail "expected 3 step records in $run/metrics.jsonl"
    echo "slurm multi-node: ok" ;;

  scaling)
    # Array tasks 0 and 1 = 1 and 2 nodes of 1 rank, strong and weak, 2 steps each.
    export NODE_COUNTS="1 2" TASKS_PER_NODE=1 MODES="strong weak" STEPS=2 GLOBAL_BATCH=4 \
      PER_RANK_BATCH=2 MICRO_BATCH=2 CAMPAIGN_DIR=$work/campaign
    expect_rc 0 "$fake/sbatch" --array=0-1 --nodes=2 "$src/slurm/scaling.sbatch" "${small[@]}"
    for d in strong-r1 strong-r2 weak-r1 weak-r2; do
      [[ $(steps_in "$CAMPAIGN_DIR/$d") == 2 ]] || fail "expected 2 step records in $d"
    done
    grep -q 'global_batch_size: 4' "$CAMPAIGN_DIR/weak-r2/metrics.jsonl" ||
      fail "weak scaling at 2 ranks did not run a global batch of 2 x 2"
    # An index past NODE_COUNTS, and a node count larger than the allocation, are refused.
    expect_rc 2 "$fake/sbatch" --array=2 --nodes=2 "$src/slurm/scaling.sbatch"
    expect_rc 2 "$fake/sbatch" --array=1 --nodes=1 "$src/slurm/scaling.sbatch"
    echo "slurm scaling: ok" ;;

  preempt-logic)
    # The batch shell's part alone, with a stand-in for dstrain that stops with exit 7 on
    # SIGUSR1 as dstrain does (the real one: mode preempt): the trap, the forwarding
    # through srun, the requeue on 7, the end on 0, the failure on anything else.
    cat > stub-dstrain <<'STUB'
#!/usr/bin/env bash
# stub: exit ${STUB_RC} at once if set; otherwise run until SIGUSR1, then exit 7.
[[ -n "${STUB_RC:-}" ]] && exit "$STUB_RC"
trap 'echo "stub rank ${OMPI_COMM_WORLD_RANK:-?}: SIGUSR1"; exit 7' USR1
echo "stub rank ${OMPI_COMM_WORLD_RANK:-?}: running"
for _ in $(seq 600); do sleep 0.1; done
exit 1
STUB
    chmod +x stub-dstrain
    export DSTRAIN=$work/stub-dstrain
    "$fake/sbatch" --ntasks-per-node=2 "$src/slurm/preemptible.sbatch" > run1.log 2>&1 &
    job=$!
    for _ in $(seq 300); do [[ $(grep -c "running" run1.log) == 2 ]] && break; sleep 0.1; done
    kill -USR1 "$job"
    rc=0; wait "$job" || rc=$?
    cat run1.log
    [[ $rc == 7 ]] || fail "pre-empted attempt: expected exit 7, got $rc"
    [[ $(grep -c "stub rank .: SIGUSR1" run1.log) == 2 ]] || fail "SIGUSR1 did not reach both ranks"
    grep -qx "requeue 4242" state/requeue || fail "no requeue recorded"
    STUB_RC=0 SLURM_RESTART_COUNT=1 expect_rc 0 "$fake/sbatch" --ntasks-per-node=2 "$src/slurm/preemptible.sbatch"
    STUB_RC=1 SLURM_RESTART_COUNT=2 expect_rc 1 "$fake/sbatch" --ntasks-per-node=2 "$src/slurm/preemptible.sbatch"
    [[ $(wc -l < state/requeue) == 1 ]] || fail "a finished or failed attempt was requeued"
    echo "slurm preempt-logic: ok" ;;

  preempt)
    # The real thing: dstrain trains; SIGUSR1 to the batch shell once it has done a step;
    # dstrain checkpoints and exits 7; the job is requeued; the requeued job (same job id,
    # SLURM_RESTART_COUNT=1) resumes from the checkpoint and finishes.
    # 20 steps of 4 sequences: the signal comes after the first (~0.3 s each) with time to
    # spare, and the resumed run stays short.
    steps=20
    small+=(--set training.global_batch_size=4 --set "training.max_steps=$steps" --set checkpoint.every_steps=0)
    "$fake/sbatch" --ntasks-per-node=2 --cpus-per-task=1 "$src/slurm/preemptible.sbatch" \
      "${small[@]}" > run1.log 2>&1 &
    job=$!
    for _ in $(seq 600); do grep -q "^step " run1.log && break; sleep 0.1; done
    kill -USR1 "$job"
    rc=0; wait "$job" || rc=$?
    cat run1.log
    [[ $rc == 7 ]] || fail "pre-empted attempt: expected exit 7, got $rc"
    grep -q "SLURM_RESTART_COUNT=0" run1.log || fail "restart count not logged"
    grep -qx "requeue 4242" state/requeue || fail "no requeue recorded"
    run=$work/runs/dstrain-4242
    done1=$(steps_in "$run")
    (( done1 < steps )) || fail "the first attempt ran all $steps steps: the signal came too late"
    SLURM_RESTART_COUNT=1 "$fake/sbatch" --ntasks-per-node=2 --cpus-per-task=1 "$src/slurm/preemptible.sbatch" \
      "${small[@]}" > run2.log 2>&1 || {
      cat run2.log; fail "the requeued attempt failed"; }
    cat run2.log
    grep -q "SLURM_RESTART_COUNT=1" run2.log || fail "restart count not logged"
    grep -q "resumed from" run2.log || fail "the requeued attempt did not resume"
    grep -q "^step  *$steps/$steps " run2.log || fail "the requeued attempt did not reach step $steps"
    [[ $(wc -l < state/requeue) == 1 ]] || fail "the finished attempt was requeued"
    echo "slurm preempt: ok (pre-empted after $done1 step records, resumed, finished $steps steps)" ;;

  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
# Passed (every failure above exits): drop the runs and checkpoints (up to 200 MB a mode);
# DSTRAIN_KEEP_TEST_OUTPUT=1 keeps them.
[[ "${DSTRAIN_KEEP_TEST_OUTPUT:-}" == 1 ]] || rm -rf "$work"
