#!/usr/bin/env bash
# End-to-end checks of `dstrain prep` on the demo corpus, launched as users do.
#   prep_runs.sh MODE DSTRAIN PREP_CHECK SOURCE_DIR WORK_DIR [RANKS]
# MODE: roundtrip | interrupted | bad-utf8 | train
set -euo pipefail
mode=$1 dstrain=$2 check=$3 src=$4 work=$5 ranks=${6:-2}
mkdir -p "$work"
"$src/scripts/prepare-demo-data" "$work/data" >/dev/null
text=$work/data/fortunes.txt  # every fortune, separated by lines of %
launch=(mpiexec -n "$ranks" --oversubscribe)
out=$work/$mode.np$ranks
rm -rf "$out"
case "$mode" in
  roundtrip)
    # Text with separators, a 1 MiB shard size (several shards per rank), every 20th
    # document held out; then the same documents as JSON Lines with another field name.
    "${launch[@]}" "$dstrain" prep --out "$out" --byte --separator % --valid-every 20 \
      --shard-mb 1 --name text "$text"
    "$check" compare "$text" % 20 "$out/text-train.manifest" "$out/text-valid.manifest"
    "$check" jsonl "$text" % "$out/corpus.jsonl"
    "${launch[@]}" "$dstrain" prep --out "$out" --byte --format jsonl --field body --name json \
      "$out/corpus.jsonl"
    "$check" compare "$text" % 0 "$out/json-train.manifest"
    # A second prep into the same name is refused without --overwrite (usage of the
    # folder, reported once).
    if "${launch[@]}" "$dstrain" prep --out "$out" --byte --name json "$out/corpus.jsonl" \
         >"$out/again.log" 2>&1; then
      echo "a second prep over an existing dataset succeeded"; exit 1
    fi
    grep -q "already holds dataset 'json'.*--overwrite" "$out/again.log"
    echo "prep roundtrip: ok at $ranks ranks" ;;
  interrupted)
    # A malformed line in the middle of a JSON Lines file, after enough documents that
    # several small shards were finished (document 3001: rank 1 of 2 finds it): the job fails, naming file and line, and
    # leaves no shard and no manifest.
    "$check" jsonl "$text" % "$work/good.np$ranks.jsonl" >/dev/null
    bad=$work/bad.np$ranks.jsonl
    head -n 3002 "$work/good.np$ranks.jsonl" > "$bad"
    echo '{"body": "an unterminated string}' >> "$bad"
    tail -n 200 "$work/good.np$ranks.jsonl" >> "$bad"
    rc=0
    "${launch[@]}" "$dstrain" prep --out "$out" --byte --format jsonl --field body \
      --shard-mb 0.05 "$bad" || rc=$?
    echo "prep exit code: $rc"
    [[ $rc -eq 1 ]] || { echo "expected exit code 1"; exit 1; }
    left=$(find "$out" -name '*.h5' -o -name '*.manifest' -o -name '*.tmp')
    [[ -z "$left" ]] || { echo "left behind:"; echo "$left"; exit 1; }
    echo "interrupted: nothing left in $out" ;;
  bad-utf8)
    printf 'fine\n%%\nstill fine\n%%\nbad \xff byte\n' > "$work/bad-utf8.txt"
    rc=0
    "${launch[@]}" "$dstrain" prep --out "$out" --tokenizer "$src/tests/data/tokenizer/tiny-bpe.json" \
      --eos '<|end|>' --separator % "$work/bad-utf8.txt" || rc=$?
    echo "prep exit code: $rc"
    [[ $rc -eq 1 ]] || exit 1
    "${launch[@]}" "$dstrain" prep --out "$out" --tokenizer "$src/tests/data/tokenizer/tiny-bpe.json" \
      --eos '<|end|>' --separator % --utf8 replace "$work/bad-utf8.txt"
    echo "bad-utf8: replaced" ;;
  train)
    # The demo's way (scripts/run-demo): every 20th fortune held out by prep. One rank
    # keeps the documents in input order, so the shards hold exactly the token streams of
    # fortunes-train.txt / fortunes-valid.txt (the same split as text): training on
    # either must give identical losses (2 ranks, 3 steps).
    mpiexec -n 1 "$dstrain" prep --out "$out" --byte --separator % --valid-every 20 \
      --name fortunes "$text" >/dev/null
    common=(--set data.seq_len=64 --set training.micro_batch_size=2 --set training.global_batch_size=8
            --set training.max_steps=3 --set training.schedule.warmup_steps=2 --set logging.every_steps=1
            --set eval.batches=2)
    launch2=(mpiexec -n 2 --oversubscribe)
    "${launch2[@]}" "$dstrain" train "$src/inputs/tiny.yaml" "${common[@]}" \
      --set "data.train=$out/fortunes-train.manifest" --set "data.valid=$out/fortunes-valid.manifest" \
      --set data.format=hdf5 --set "run.output_dir=$out/h5"
    "${launch2[@]}" "$dstrain" train "$src/inputs/tiny.yaml" "${common[@]}" \
      --set "data.train=$work/data/fortunes-train.txt" --set "data.valid=$work/data/fortunes-valid.txt" \
      --set data.format=text --set "run.output_dir=$out/text" >/dev/null
    losses() { grep '"type":"step"' "$out/$1/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
    [[ -n "$(losses h5)" && "$(losses h5)" == "$(losses text)" ]] || {
      echo "losses differ:"; paste <(losses h5) <(losses text); exit 1; }
    echo "train from shards: losses identical to text data: $(losses h5 | tr '\n' ' ')" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
