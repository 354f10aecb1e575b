"""The shards `dstrain prep` wrote, read with h5py (an independent reader of
docs/dataset.md): every shard listed by the manifests has the documented attributes,
dtypes and offsets, every document ends with EOS and holds no other special id, and the
manifests together hold the expected number of documents.

usage: check_prep_h5py.py MANIFEST... EXPECTED_DOCUMENTS
"""
import os
import sys

import h5py
import numpy as np


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


def main():
    *manifests, expected = sys.argv[1:]
    docs = shards = 0
    for manifest in manifests:
        check(os.path.exists(manifest), f"{manifest} missing (run dstrain_prep_roundtrip.np2 first)")
        folder = os.path.dirname(manifest)
        names = [l.strip() for l in open(manifest) if l.strip() and not l.startswith("#")]
        for name in names:
            path = os.path.join(folder, name)
            with h5py.File(path, "r") as f:
                a = f.attrs
                check(a["format"] in ("dstrain.tokens", b"dstrain.tokens"), f"{path}: format")
                check(int(a["format_version"]) == 1, f"{path}: format_version")
                check(int(a["vocab_size"]) == 260 and int(a["eos_id"]) == 257, f"{path}: vocab/eos")
                tokens = f["tokens"][...]
                offsets = f["doc_offsets"][...]
                check(tokens.dtype == np.uint16, f"{path}: tokens dtype {tokens.dtype}")
                check(offsets.dtype == np.uint64, f"{path}: offsets dtype {offsets.dtype}")
                n = int(a["num_documents"])
                check(len(offsets) == n + 1 and offsets[0] == 0 and offsets[-1] == len(tokens),
                      f"{path}: offsets do not frame the tokens")
                check(np.all(np.diff(offsets.astype(np.int64)) > 0), f"{path}: empty document")
                check(np.all(tokens[offsets[1:] - 1] == 257), f"{path}: a document without EOS")
                inner = np.ones(len(tokens), bool)
                inner[offsets[1:] - 1] = False
                check(np.all(tokens[inner] < 256), f"{path}: a special id inside a document")
                check(int(a["num_tokens"]) == len(tokens), f"{path}: num_tokens")
                docs += n
                shards += 1
    check(docs == int(expected), f"{docs} documents, expected {expected}")
    print(f"prep h5py oracle: {docs} documents in {shards} shards agree")


if __name__ == "__main__":
    main()
