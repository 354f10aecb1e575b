#!/usr/bin/env python3
"""The experts' capacity (model.moe.capacity_factor) and node-limited routing
(model.moe.max_nodes_per_token) end to end on tiny-moe (8 routed experts, top-2),
micro-batch 2, global batch 8, 6 steps:

1. Capacity. On 2 ranks: a factor of 100 (no expert can reach ceil(100 x 128 x 2 / 8)
   rows) gives the dropless run bit for bit, reporting 0 dropped rows; a factor of 0.5
   drops rows in every step (moe_dropped_rows > 0 in metrics.jsonl, "dropped" in the log
   line) and trains otherwise; with expert parallelism (E = 2) the same factor drops the
   same rows (the counts equal step by step) and trains within 1e-5 of E = 1 (losses,
   final parameters): the drops are decided on each rank before the dispatch; the same
   with training.recompute full (the recomputed forward drops the same rows, counted once).
2. Node-limited routing with the test node map debug.expert_nodes = 4 (2 experts a node)
   and M = 1 (both experts of a token on one node): on 4 ranks E = 4 (one node a rank) and
   E = 2 against E = 1 within 1e-5 and the same expert loads; the limit changes the
   training (losses differ from the unlimited run); M = 4 of 4 nodes is the unlimited run
   bit for bit. Without the test map, all ranks on one host are one node: M = 1 at E = 2
   is the unlimited E = 2 run bit for bit.

usage: moe_routing_limits.py DSTRAIN DECK GENERATOR WORKDIR -- MPIEXEC NUMPROC_FLAG [PREFLAGS...]
"""
import sys

import numpy as np

from training_e2e import read_run, rel_l2, setup

TOL = 1e-5
STEPS = 6
SEQ, MICRO, GLOBAL = 64, 2, 8


def main():
    st = setup(SEQ)
    problems = []

    def run(name, ranks, expert, *extra):
        sets = ["model.preset=tiny-moe", "model.moe.bias_update_rate=0.01",
                "parallel.backend=mpi", f"parallel.expert={expert}", *extra]
        out, r, _ = st.train(name, ranks, sets, seq=SEQ, micro=MICRO, global_batch=GLOBAL,
                             steps=STEPS)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print(f"FAILED: {name} exited {r.returncode}")
            sys.exit(1)
        records, params = read_run(out)
        steps = {s["step"]: s for s in records if s.get("type") == "step"}
        return {"name": name, "steps": steps, "params": params, "log": r.stdout + r.stderr}

    def same_bits(got, ref):
        for step in range(1, STEPS + 1):
            if got["steps"][step]["loss"] != ref["steps"][step]["loss"]:
                problems.append(f"{got['name']}: step {step} loss {got['steps'][step]['loss']!r} "
                                f"!= {ref['name']} {ref['steps'][step]['loss']!r}")
                return
        for k, v in ref["params"].items():
            if not np.array_equal(got["params"][k], v):
                problems.append(f"{got['name']}: final {k} differs from {ref['name']}")
                return
        print(f"{got['name']} == {ref['name']} bit for bit")

    def close(got, ref):
        worst = max(abs(got["steps"][s]["loss"] - ref["steps"][s]["loss"]) /
                    abs(ref["steps"][s]["loss"]) for s in range(1, STEPS + 1))
        worst_p = max(rel_l2(got["params"][k], v) for k, v in ref["params"].items())
        for s in range(1, STEPS + 1):
            a, b = got["steps"][s], ref["steps"][s]
            key = lambda m: (m["max_over_mean"], m["busiest_fraction"], m["idle_experts"])
            if [key(m) for m in a["moe"]] != [key(m) for m in b["moe"]]:
                problems.append(f"{got['name']}: step {s}: expert loads differ from {ref['name']}")
            if a.get("moe_dropped_rows") != b.get("moe_dropped_rows"):
                problems.append(f"{got['name']}: step {s}: dropped rows "
                                f"{a.get('moe_dropped_rows')} != {b.get('moe_dropped_rows')}")
        print(f"{got['name']} vs {ref['name']}: losses within {worst:.1e}, parameters within "
              f"{worst_p:.1e}")
        if worst > TOL or worst_p > TOL:
            problems.append(f"{got['name']}: losses {worst:.2e} / parameters {worst_p:.2e} > {TOL}")

    def differs(got, ref):
        if all(got["steps"][s]["loss"] == ref["steps"][s]["loss"] for s in range(1, STEPS + 1)):
            problems.append(f"{got['name']}: trains exactly as {ref['name']} (the limit did nothing)")

    # 1. capacity
    free = run("np2-e1", 2, 1)
    big = run("np2-e1-cap100", 2, 1, "model.moe.capacity_factor=100")
    same_bits(big, free)
    if any(big["steps"][s].get("moe_dropped_rows") != 0 for s in range(1, STEPS + 1)):
        problems.append("capacity 100: moe_dropped_rows missing or not 0")
    if "moe_dropped_rows" in free["steps"][STEPS]:
        problems.append("the dropless run reports dropped rows")
    cap = run("np2-e1-cap0.5", 2, 1, "model.moe.capacity_factor=0.5")
    for s in range(1, STEPS + 1):
        d, f = cap["steps"][s].get("moe_dropped_rows", 0), cap["steps"][s].get("moe_dropped_fraction", 0)
        # rows a step: 8 sequences x 64 tokens x top-2 x 3 MoE blocks
        if not (d > 0 and abs(f - d / (GLOBAL * SEQ * 2 * 3)) < 1e-12):
            problems.append(f"capacity 0.5: step {s}: dropped rows {d}, fraction {f}")
    if " | dropped " not in cap["log"]:
        problems.append("capacity 0.5: the log line does not report the dropped rows")
    differs(cap, free)
    print(f"capacity 0.5: step {STEPS} dropped {cap['steps'][STEPS]['moe_dropped_rows']:.0f} rows "
          f"({100 * cap['steps'][STEPS]['moe_dropped_fraction']:.2f}%)")
    close(run("np2-e2-cap0.5", 2, 2, "model.moe.capacity_factor=0.5"), cap)
    # training.recompute full: the recomputed forward drops the same rows again (and does
    # not count them twice).
    close(run("np2-e2-cap0.5-recompute", 2, 2, "model.moe.capacity_factor=0.5",
              "training.recompute=full"), cap)

    # 2. node-limited routing
    nodes = "debug.expert_nodes=4"
    one = "model.moe.max_nodes_per_token=1"
    ref = run("np4-e1-m1", 4, 1, one, nodes)
    close(run("np4-e4-m1", 4, 4, one, nodes), ref)
    close(run("np4-e2-m1", 4, 2, one, nodes), ref)
    differs(ref, run("np4-e1", 4, 1))
    same_bits(run("np2-e1-m4", 2, 1, "model.moe.max_nodes_per_token=4", nodes), free)
    same_bits(run("np2-e2-m1-hosts", 2, 2, one), run("np2-e2", 2, 2))

    if problems:
        for p in problems:
            print("FAILED: " + p)
        return 1
    print("moe routing limits: capacity 100 == dropless, capacity 0.5 drops the same rows at "
          "E=2 and E=1, node-limited E=4 == E=2 == E=1 within 1e-5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
