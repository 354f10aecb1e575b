#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces (each with its own hostname)
# joined by a veth pair, a hostfile naming both, and mpirun starting the second node's
# daemon through an rsh agent that enters its namespace (netns-rsh) instead of ssh.
# MPI traffic then crosses a real network interface over TCP, and MPI sees two nodes:
#   multinode.sh DSTRAIN SOURCE_DIR WORK_DIR
# Checks: 2 ranks per node with node-local ranks 0 and 1 on each; `dstrain check` says
# "4 ranks on 2 nodes (up to 2 per node)"; a short `dstrain train` finishes, and its
# gradients crossed the veth link.
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN). Where `ip netns add` is refused the test
# skips (exit 77), also under CI=true: no CI setting could make it run there. Once the
# probe succeeds, every later failure is a failure.
set -euo pipefail
dstrain=$1 src=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

for tool in ip unshare mpiexec; do
  if ! command -v "$tool" >/dev/null; then
    if [[ "${CI:-}" == true ]]; then echo "multinode: $tool missing under CI=true: failing" >&2; exit 1; fi
    echo "multinode: $tool missing: skipping (scripts/install-deps --tests)" >&2; exit 77
  fi
done

# Names unique to this process: tests may run side by side. Interface names stay under
# the kernel's 15 characters.
id=$$
ns_a=dstrain-mn-a-$id ns_b=dstrain-mn-b-$id
if_a=dstmna$id if_b=dstmnb$id
host_a=node-a host_b=node-b
ip_a=10.77.0.1 ip_b=10.77.0.2 subnet=10.77.0.0/24

cleanup() {
  local ns pid
  for ns in "$ns_a" "$ns_b"; do
    # Nothing may outlive the test inside a namespace (a stray daemon).
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true  # also removes the veth pair
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true  # only when no other namespace uses it
}
trap cleanup EXIT

# The probe: create a namespace and enter it with its own hostname, as the test will.
if ! probe=$(ip netns add "$ns_a" 2>&1 && ip netns exec "$ns_a" unshare --uts true 2>&1); then
  echo "multinode: this machine does not allow network and UTS namespaces ($probe):" \
       "skipping; run as root with CAP_SYS_ADMIN and CAP_NET_ADMIN" >&2
  exit 77
fi
ip netns add "$ns_b"
ip link add "$if_a" type veth peer name "$if_b"
ip link set "$if_a" netns "$ns_a"
ip link set "$if_b" netns "$ns_b"
ip -n "$ns_a" addr add "$ip_a/24" dev "$if_a"
ip -n "$ns_b" addr add "$ip_b/24" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$if_a" up
ip -n "$ns_b" link set "$if_b" up
# Host names: `ip netns exec` shows /etc/netns/<ns>/hosts as /etc/hosts inside <ns>.
for ns in "$ns_a" "$ns_b"; do
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$ip_a" "$host_a" "$ip_b" "$host_b" > "/etc/netns/$ns/hosts"
done
echo "multinode: $host_a = $ns_a ($if_a $ip_a), $host_b = $ns_b ($if_b $ip_b)"

rm -rf "$work"
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
printf '%s slots=2\n%s slots=2\n' "$host_a" "$host_b" > "$work/hostfile"
export DST_NETNS_HOSTS="$host_a=$ns_a $host_b=$ns_b"

# mpirun runs on node-a; node-b's daemon is started through netns-rsh. TCP only, and only
# over the veth link. Its subnet names it: each namespace has only one of the two
# interface names, and Open MPI refuses an interface name it cannot find.
# Namespaces need root; so does Open MPI's consent to run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun_on_a() {
  # shellcheck disable=SC2016  # expanded by the inner shell
  ip netns exec "$ns_a" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' netns-rsh "$host_a" \
    mpiexec -n 4 --hostfile "$work/hostfile" --map-by ppr:2:node \
    --mca plm_rsh_agent "$here/netns-rsh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    "$@"
}
fail() { echo "multinode: FAILED: $*" >&2; exit 1; }

# 1. Placement as MPI reports it: ranks 0,1 on node-a and 2,3 on node-b, node-local 0,1.
# shellcheck disable=SC2016  # expanded by each rank's shell
mpirun_on_a sh -c 'echo "placement: rank $OMPI_COMM_WORLD_RANK local $OMPI_COMM_WORLD_LOCAL_RANK of $OMPI_COMM_WORLD_LOCAL_SIZE on $(hostname)"' \
  | sort | tee "$work/placement.txt"
expected="placement: rank 0 local 0 of 2 on $host_a
placement: rank 1 local 1 of 2 on $host_a
placement: rank 2 local 0 of 2 on $host_b
placement: rank 3 local 1 of 2 on $host_b"
[[ "$(cat "$work/placement.txt")" == "$expected" ]] || fail "placement differs from 2 ranks per node"

# 2. dstrain's own view of the layout (node-local ranks from MPI_Comm_split_type).
mpirun_on_a "$dstrain" check "$src/inputs/tiny.yaml" --set training.micro_batch_size=4 2>&1 | tee "$work/check.log"
grep -q "^layout: 4 ranks on 2 nodes (up to 2 per node) | data 4 x tensor 1 x pipeline 1" "$work/check.log" ||
  fail "dstrain check did not report 4 ranks on 2 nodes"
grep -q "deck is valid" "$work/check.log" || fail "dstrain check did not accept the deck"

# 3. A short training run across the link.
rx_before=$(ip netns exec "$ns_b" cat "/sys/class/net/$if_b/statistics/rx_bytes")
mpirun_on_a "$dstrain" train "$src/inputs/tiny.yaml" --set "run.output_dir=$work/train" \
  --set "data.train=$work/data/fortunes-train.txt" --set "data.valid=$work/data/fortunes-valid.txt" \
  --set data.seq_len=64 --set training.micro_batch_size=2 --set training.global_batch_size=8 \
  --set training.max_steps=3 --set training.schedule.warmup_steps=1 --set logging.every_steps=1 \
  --set eval.batches=2 2>&1 | tee "$work/train.log"
rx_after=$(ip netns exec "$ns_b" cat "/sys/class/net/$if_b/statistics/rx_bytes")
grep -q "^layout: 4 ranks on 2 nodes (up to 2 per node)" "$work/train.log" || fail "train layout"
grep -q "^done: 3 steps" "$work/train.log" || fail "training did not finish"
grep -q '"world_size":4' "$work/train/metrics.jsonl" || fail "metrics header does not say 4 ranks"
[[ $(grep -c '"type":"step"' "$work/train/metrics.jsonl") == 3 ]] || fail "expected 3 step records"
# Each step all-reduces the gradients of 3.3 M fp32 parameters: several MB must have
# reached node-b over the veth link (1 MB is far below that and far above control traffic).
received=$(( rx_after - rx_before ))
(( received > 1000000 )) || fail "only $received bytes reached $host_b over $if_b: MPI did not use the link"
echo "multinode: ok: 4 ranks on 2 nodes, 2 per node, training finished, $(( received / 1000000 )) MB received by $host_b over $if_b"
