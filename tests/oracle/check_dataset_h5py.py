"""The token shard format (docs/dataset.md) checked with h5py, an independent reader.

1. dstrain writes shards (dataset_shards write); h5py reads them back and checks every
   dataset, dtype, attribute and token against the corpus formula; h5dump parses them.
2. h5py writes a shard from the documentation alone; dstrain's validator must accept it,
   and must reject (naming the file) a copy with a broken offset.

usage: check_dataset_h5py.py DATASET_SHARDS_EXE WORKDIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np


def corpus(num_docs, token):
    docs = []
    for d in range(num_docs):
        n = 1 + (37 * d) % 23
        docs.append([token(d, j) for j in range(n)])
    return docs


def stream_and_offsets(docs, eos):
    stream, offsets = [], [0]
    for doc in docs:
        stream += doc + [eos]
        offsets.append(len(stream))
    return np.array(stream), np.array(offsets, dtype=np.uint64)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


def check_written(path, docs, vocab, eos, dtype, tokenizer):
    stream, offsets = stream_and_offsets(docs, eos)
    with h5py.File(path, "r") as f:
        a = f.attrs
        check(a["format"] == "dstrain.tokens", f"{path}: format attr {a['format']!r}")
        check(isinstance(a["tokenizer_name"], str), f"{path}: tokenizer_name is not a str")
        check(int(a["format_version"]) == 1, f"{path}: format_version")
        check(int(a["vocab_size"]) == vocab, f"{path}: vocab_size")
        check(int(a["eos_id"]) == eos, f"{path}: eos_id")
        check(a["tokenizer_name"] == tokenizer, f"{path}: tokenizer_name {a['tokenizer_name']}")
        check(a["tokenizer_hash"].startswith("fnv1a64:"), f"{path}: tokenizer_hash")
        check(int(a["num_tokens"]) == len(stream), f"{path}: num_tokens")
        check(int(a["num_documents"]) == len(docs), f"{path}: num_documents")
        t = f["tokens"]
        check(t.dtype == np.dtype(dtype), f"{path}: tokens dtype {t.dtype}, expected {dtype}")
        check(t.chunks is not None and t.compression is None, f"{path}: chunked, uncompressed")
        check(t.shape == (len(stream),), f"{path}: tokens shape {t.shape}")
        check(np.array_equal(t[...].astype(np.int64), stream), f"{path}: token values")
        o = f["doc_offsets"]
        check(o.dtype == np.uint64, f"{path}: doc_offsets dtype {o.dtype}")
        check(np.array_equal(o[...], offsets), f"{path}: doc_offsets values")
    print(f"h5py: {os.path.basename(path)} matches ({len(stream)} tokens, {len(docs)} documents, {dtype})")


def write_with_h5py(path, docs, vocab, eos):
    stream, offsets = stream_and_offsets(docs, eos)
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=stream.astype(np.uint16), chunks=(128,), maxshape=(None,))
        f.create_dataset("doc_offsets", data=offsets)
        f.attrs["format"] = "dstrain.tokens"
        f.attrs["format_version"] = np.uint32(1)
        f.attrs["vocab_size"] = np.uint64(vocab)
        f.attrs["eos_id"] = np.uint64(eos)
        f.attrs["tokenizer_name"] = "byte260"
        f.attrs["tokenizer_hash"] = "fnv1a64:0000000000000000"
        f.attrs["num_tokens"] = np.uint64(len(stream))
        f.attrs["num_documents"] = np.uint64(len(docs))


def main():
    exe, work = sys.argv[1], os.path.join(sys.argv[2], "dataset_h5py")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    subprocess.run([exe, "write", work], check=True)
    check(sorted(os.listdir(work)) == ["bytes.h5", "wide.h5"], f"files left: {os.listdir(work)}")
    check_written(os.path.join(work, "bytes.h5"),
                  corpus(300, lambda d, j: (131 * d + 17 * j) % 256), 260, 257, "<u2", "byte260")
    check_written(os.path.join(work, "wide.h5"),
                  corpus(50, lambda d, j: ((131 * d + 17 * j) * 389) % 99999), 100000, 99999,
                  "<u4", "wide-test")
    if shutil.which("h5dump"):
        out = subprocess.run(["h5dump", "-H", os.path.join(work, "bytes.h5")], check=True,
                             capture_output=True, text=True).stdout
        check('DATASET "tokens"' in out and "H5T_STD_U16LE" in out, "h5dump header")
        print("h5dump: bytes.h5 header parses")

    # The other direction: a shard written from docs/dataset.md alone.
    ours = os.path.join(work, "from_h5py.h5")
    write_with_h5py(ours, corpus(40, lambda d, j: (7 * d + j) % 256), 260, 257)
    r = subprocess.run([exe, "validate", ours], capture_output=True, text=True)
    print(r.stdout.strip())
    check(r.returncode == 0 and "valid: " in r.stdout, "dstrain rejects an h5py-written shard")
    bad = os.path.join(work, "bad_offsets.h5")
    shutil.copy(ours, bad)
    with h5py.File(bad, "r+") as f:
        f["doc_offsets"][5] = 10**6
    r = subprocess.run([exe, "validate", bad], capture_output=True, text=True)
    print(r.stdout.strip())
    check(r.returncode == 1 and "bad_offsets.h5" in r.stdout and "doc_offsets" in r.stdout,
          "dstrain accepts a shard with a broken offset")
    print("dataset h5py oracle: all checks passed")


if __name__ == "__main__":
    main()
