#!/usr/bin/env bash
# Two jobs on one CPU, end to end: cpu_sharing.sh DSTRAIN DECK WORK_DIR
# 1. A first dstrain (a singleton, confined to the first CPU this script may use) stops in
#    start-up (DSTRAIN_DEBUG_STALL_*), after its own CPU check; it is still a live process
#    named dstrain, as a rank of another job computing on that CPU would be.
# 2. A second singleton on the same CPU must warn once, naming its rank, the first one's
#    pid and the CPU. This also shows the OpenBLAS kernel re-execution keeps the name
#    "dstrain" (blas::select_host_kernels), without which the first is not found.
# 3. With the first one gone, the second does not warn.
set -uo pipefail
dstrain=$1 deck=$2 work=$3
mkdir -p "$work"
cpu=$(awk '/^Cpus_allowed_list:/ { split($2, a, "[,-]"); print a[1] }' /proc/self/status)
fail=0

DSTRAIN_DEBUG_STALL_RANK=0 DSTRAIN_DEBUG_STALL_STEP="deck broadcast" \
  taskset -c "$cpu" "$dstrain" check "$deck" --init-timeout 60 >"$work/first.log" 2>&1 &
first=$!
trap 'kill -9 "$first" 2>/dev/null' EXIT
for _ in $(seq 1 300); do
  grep -q "fault injection: stalling" "$work/first.log" && break
  sleep 0.1
done
if ! grep -q "fault injection: stalling" "$work/first.log"; then
  echo "FAILED: the first dstrain did not reach its stall:"; cat "$work/first.log"; exit 1
fi
echo "first dstrain: pid $first, name '$(cat /proc/$first/comm)', CPU $cpu"

out=$(taskset -c "$cpu" "$dstrain" check "$deck" 2>&1)
echo "--- second dstrain on CPU $cpu ---"
echo "$out"
want="[rank 0] warning: cpus: 2 processes share CPU $cpu of $(cat /proc/sys/kernel/hostname) (1 CPU): rank 0 of this job and dstrain pid $first (not of this job); each computes at about 1/2 of a CPU's speed. Open MPI binds every job's ranks from the first core up"
n=$(grep -cF "$want" <<<"$out")
if [[ $n -ne 1 ]]; then echo "FAILED: expected one line starting '$want', found $n"; fail=1; fi

kill -9 "$first" 2>/dev/null
wait "$first" 2>/dev/null
out=$(taskset -c "$cpu" "$dstrain" check "$deck" 2>&1)
echo "--- second dstrain alone ---"
echo "$out"
if grep -q "cpus:" <<<"$out"; then echo "FAILED: warned with the first one gone"; fail=1; fi

[[ $fail -eq 0 ]] && echo "cpu sharing: the second job named the first one's pid"
exit $fail
