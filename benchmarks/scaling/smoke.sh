#!/usr/bin/env bash
# Smoke run of the scaling driver: 1 and 2 ranks, strong and weak, 3 steps each on the
# tiny deck at sequence length 64 (text data); checks that the CSV has one sane row per
# run and that the plot is a PNG. Proves the campaign works end to end, not the figures.
#   smoke.sh PYTHON DSTRAIN SOURCE_DIR WORK_DIR [MPIEXEC] [local|slurm]
# slurm: the same campaign (strong scaling only) submitted through slurm/scaling.sbatch
# with the fake sbatch of tests/scripts/fake-slurm (one array task per rank count).
set -euo pipefail
py=$1 dstrain=$2 src=$3 work=$4 mpiexec=${5:-mpiexec} how=${6:-local}
# The plot needs matplotlib from the oracle environment: skip without it, fail under CI.
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  if [[ "${CI:-}" == true ]]; then echo "scaling smoke: no matplotlib in $py under CI=true: failing" >&2; exit 1; fi
  echo "scaling smoke: no matplotlib in $py: skipping (scripts/setup-oracles)" >&2; exit 77
fi
rm -rf "$work"
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
modes=(strong weak) extra=()
if [[ "$how" == slurm ]]; then
  modes=(strong)
  extra=(--slurm --tasks-per-node 1 --sbatch "$src/tests/scripts/fake-slurm/sbatch" --wait)
  export FAKE_SLURM_MPIEXEC=$mpiexec
fi
"$py" "$src/benchmarks/scaling/scaling.py" --dstrain "$dstrain" --deck "$src/inputs/tiny.yaml" \
  --out "$work/campaign" --ranks 1 2 --modes "${modes[@]}" --steps 3 --warmup 1 \
  --global-batch 4 --per-rank-batch 2 --micro-batch 2 \
  --launcher "$mpiexec --oversubscribe -n {ranks}" \
  --set "data.train=$work/data/fortunes-train.txt" --set "data.valid=$work/data/fortunes-valid.txt" \
  --set data.seq_len=64 --set eval.batches=1 "${extra[@]}"
csv=$work/campaign/scaling.csv png=$work/campaign/scaling.png
cat "$csv"
# One row per (mode, ranks), 2 measured steps each, positive throughput, efficiency 1 at
# the base count and, elsewhere, the row's own figures' ratio: tokens/s over the base
# count's, divided by the rank ratio. A 3-step run on 2 shared cores may be slow or fast
# by any factor (CTest runs other tests beside it), so the figures themselves are not
# judged here; benchmarks/scaling measures them.
awk -F, -v want="${modes[*]}" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  { rows++; k = $col["mode"] "-" $col["ranks"]; key[k] = 1
    tps[k] = $col["tokens_per_s_median"]; eff[k] = $col["efficiency"]
    if ($col["steps_measured"] != 2) bad = bad " " k ": steps_measured " $col["steps_measured"]
    if ($col["tokens_per_s_median"] <= 0) bad = bad " " k ": tokens/s " $col["tokens_per_s_median"]
    if ($col["ranks"] == 1 && eff[k] != 1) bad = bad " " $1 "-1: efficiency " eff[k] " at the base count" }
  END { n = split(want, m, " ")
        for (i = 1; i <= n; i++) {
          if (!((m[i] "-1") in key) || !((m[i] "-2") in key)) { bad = bad " no " m[i] " rows"; continue }
          b = m[i] "-1"; t = m[i] "-2"
          expect = tps[t] / tps[b] / 2
          if (eff[t] <= 0 || (eff[t] - expect) > 0.01 * expect || (expect - eff[t]) > 0.01 * expect)
            bad = bad " " t ": efficiency " eff[t] ", its tokens/s give " expect }
        if (rows != 2 * n) bad = bad " expected " 2 * n " rows (" want " x 1, 2 ranks), got " rows
        if (bad != "") { print "scaling smoke: bad CSV:" bad > "/dev/stderr"; exit 1 } }' "$csv"
[[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] || { echo "scaling smoke: $png is not a PNG" >&2; exit 1; }
(( $(wc -c < "$png") > 10000 )) || { echo "scaling smoke: $png is suspiciously small" >&2; exit 1; }
bytes=$(wc -c < "$png")
# Passed: drop the runs and their checkpoints (about 200 MB); DSTRAIN_KEEP_TEST_OUTPUT=1 keeps them.
[[ "${DSTRAIN_KEEP_TEST_OUTPUT:-}" == 1 ]] || rm -rf "$work"
echo "scaling smoke ($how): ok ($bytes byte plot)"
