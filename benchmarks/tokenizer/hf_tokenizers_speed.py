#!/usr/bin/env python3
"""Hugging Face tokenizers' single-threaded encoding speed on the tokenizer corpus, the
reference for benchmarks/tokenizer/tokenizer_benchmark (same file, whole-file encode,
repeated so that its word cache is warm, as ours is).

usage: $(scripts/setup-oracles) benchmarks/tokenizer/hf_tokenizers_speed.py \
           [--corpus PATH] [--seconds S] TOKENIZER_JSON...
"""
import argparse
import os
import time
from pathlib import Path

# Single-threaded: no Rayon pool (tokenizers reads these at import).
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
from tokenizers import Tokenizer  # noqa: E402

root = Path(__file__).resolve().parents[2]
p = argparse.ArgumentParser()
p.add_argument("--corpus", default=str(root / "tests/data/tokenizer/corpus.txt"))
p.add_argument("--seconds", type=float, default=3.0)
p.add_argument("tokenizers", nargs="+")
a = p.parse_args()
text = Path(a.corpus).read_bytes().decode("utf-8")
nbytes = len(text.encode("utf-8"))
for path in a.tokenizers:
    tok = Tokenizer.from_file(path)
    n_ids = len(tok.encode(text, add_special_tokens=False).ids)  # warm the cache
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        tok.encode(text, add_special_tokens=False)
        n += 1
    dt = time.perf_counter() - t0
    print(f"{path}: {nbytes * n / dt / 1e6:.2f} MB/s ({n} encodes of {nbytes} bytes, {n_ids} ids)")
