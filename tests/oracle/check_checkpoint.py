#!/usr/bin/env python3
"""The checkpoint format (docs/checkpoint.md) checked from the other side: a checkpoint
written by dstrain on two ranks (tests/mpi/ckpt/checkpoint_tool.cpp, `write`) is read with
h5py, and every value is re-derived independently: the manifest's size and whole-file
xxh64 (the `xxhash` package), each dataset's checksum by the documented definition, each
tensor's values from the tool's formula, and every metadata attribute.

usage: check_checkpoint.py OUT_DIR LAUNCHER... CHECKPOINT_TOOL
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np
import xxhash

BLOCK = 1 << 20  # checksum block, bytes

# Mirrors kTensors in checkpoint_tool.cpp, in order (k is the index).
TENSORS = [
    ("params/model.embed_tokens.weight", (260, 48)),
    ("params/model.layers.0.self_attn.q_proj.weight", (48, 48)),
    ("params/model.layers.0.mlp.up_proj.weight", (520, 700)),
    ("params/model.norm.weight", (48,)),
    ("params/model.step_scalar", ()),
    ("params/model.empty", (0, 4)),
    ("optimizer/exp_avg/model.layers.0.mlp.up_proj.weight", (520, 700)),
    ("optimizer/exp_avg_sq/model.norm.weight", (48,)),
]

META = {  # root attributes the tool writes (make_meta(7, 2))
    "format": b"dstrain-checkpoint", "format_version": 1, "step": 7, "epoch": 3,
    "consumed": 1000, "samples_seen": 98765, "optimizer_steps": 7, "skipped_steps": 0,
    "seed": 1234, "rng": b"philox seed 1234", "loss_scale": 1.0, "loss_scale_clean_steps": 0,
    "software_version": b"dstrain oracle-writer", "world_size": 2, "data_parallel": 2,
    "tensor_parallel": 1, "pipeline_parallel": 1, "global_batch_size": 8, "micro_batch_size": 2,
    "grad_accum_steps": 2,
}
DECK = b"run:\n  seed: 1234\nmodel:\n  preset: tiny\ntraining:\n  max_steps: 7\n"


def expected_values(k, shape):
    n = int(np.prod(shape, dtype=np.uint64)) if shape else 1
    i = np.arange(n, dtype=np.uint64)
    v = (i * np.uint64(2654435761) + np.uint64(k * 97)) % np.uint64(1000003)
    return (v.astype(np.float64) / 1000003.0 - 0.5).astype(np.float32).reshape(shape)


def tensor_checksum(arr):
    """docs/checkpoint.md: xxh64 of each 1 MiB block of the little-endian bytes, then
    xxh64 of the block digests as u64 little-endian."""
    data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
    digests = b"".join(struct.pack("<Q", xxhash.xxh64_intdigest(data[a:a + BLOCK]))
                       for a in range(0, len(data), BLOCK))
    return xxhash.xxh64_intdigest(digests)


def fail(msg):
    print(f"checkpoint oracle: FAILED: {msg}")
    sys.exit(1)


def main():
    out, launcher, tool = sys.argv[1], sys.argv[2:-1], sys.argv[-1]
    shutil.rmtree(out, ignore_errors=True)
    run = subprocess.run(launcher + [tool, "write", out], capture_output=True, text=True)
    print(run.stdout + run.stderr, end="")
    if run.returncode != 0:
        fail(f"checkpoint_tool exited with {run.returncode}")
    path = os.path.join(out, "step-7.h5")

    with open(os.path.join(out, "latest")) as f:
        if f.read().strip() != "step-7.h5":
            fail("latest does not name step-7.h5")
    with open(os.path.join(out, "step-7.manifest.json")) as f:
        manifest = json.load(f)
    with open(path, "rb") as f:
        raw = f.read()
    want = {"format": "dstrain-checkpoint-manifest", "manifest_version": 1,
            "checkpoint_format_version": 1, "file": "step-7.h5", "size": len(raw),
            "xxh64": xxhash.xxh64_hexdigest(raw), "step": 7}
    for key, value in want.items():
        if manifest.get(key) != value:
            fail(f"manifest {key} is {manifest.get(key)!r}, expected {value!r}")
    print(f"manifest xxh64 matches: {manifest['xxh64']} over {len(raw)} bytes")

    with h5py.File(path, "r") as h5:
        for key, value in META.items():
            got = h5.attrs[key]
            if isinstance(value, float):
                ok = float(got) == value
            else:
                ok = got == value or (isinstance(got, np.ndarray) and got.tolist() == value)
            if not ok:
                fail(f"root attribute {key} is {got!r}, expected {value!r}")
        if h5.attrs["created_utc"].decode() != manifest["created_utc"]:
            fail("created_utc differs between file and manifest")
        if h5["meta/deck_yaml"][()] != DECK:
            fail(f"meta/deck_yaml is {h5['meta/deck_yaml'][()]!r}")
        print(f"metadata: {len(META)} root attributes and the deck match")

        datasets = []
        h5.visititems(lambda name, obj: datasets.append(name)
                      if isinstance(obj, h5py.Dataset) and not name.startswith("meta/") else None)
        if sorted(datasets) != sorted(name for name, _ in TENSORS):
            fail(f"datasets {sorted(datasets)} differ from the tool's tensors")
        for k, (name, shape) in enumerate(TENSORS):
            ds = h5[name]
            if ds.shape != shape or ds.dtype != np.dtype("<f4"):
                fail(f"{name}: shape {ds.shape} dtype {ds.dtype}, expected {shape} <f4")
            if ds.chunks is not None:
                fail(f"{name}: chunked, expected contiguous layout")
            values = ds[()]
            want_values = expected_values(k, shape)
            if not np.array_equal(values.view(np.uint32), want_values.view(np.uint32)):
                fail(f"{name}: values differ from the formula")
            stored = int(ds.attrs["checksum_xxh64"])
            if stored != tensor_checksum(want_values):
                fail(f"{name}: checksum_xxh64 {stored:016x}, computed "
                     f"{tensor_checksum(want_values):016x}")
        print(f"{len(TENSORS)} tensor checksums match (values bit-exact, contiguous f32)")
    print("checkpoint oracle: all checks passed")


if __name__ == "__main__":
    main()
