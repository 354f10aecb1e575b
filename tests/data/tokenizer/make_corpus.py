#!/usr/bin/env python3
"""Assembles corpus.txt, the tokenizer parity corpus, from real text found on a Debian 12
machine (see README.md for each part's origin and licence). Each part is a prefix of
its source cut at a line end, so the corpus is verbatim text; the sections are joined
with a one-line header. Re-running it on another machine may give a different file:
the committed corpus.txt is the test input, this script only records how it was made.
"""
import sys
from pathlib import Path

PY = Path(sys.argv[1] if len(sys.argv) > 1 else "/root/.pyenv/versions/3.13.0/lib/python3.13")
VIM = Path("/usr/share/vim/vim90/tutor")
EMOJI = Path(sys.argv[2] if len(sys.argv) > 2 else
             "/usr/lib/python3/dist-packages/pip/_vendor/rich/_emoji_codes.py")

# (section, source, start line, max bytes)
PARTS = [
    ("English prose", Path("/usr/share/common-licenses/GPL-3"), 0, 20000),
    ("Chinese", VIM / "tutor.zh_cn.utf-8", 0, 20000),
    ("source code (Python)", PY / "textwrap.py", 0, 14000),
    ("source code (C)", Path("/usr/include/pcre2.h"), 0, 6000),
    ("digits and numbers (tz database)", Path("/usr/share/zoneinfo/tzdata.zi"), 0, 10000),
    ("digits and numbers (cmath test cases)", PY / "test/mathdata/cmath_testcases.txt", 60, 9000),
    ("whitespace: CRLF", PY / "venv/scripts/common/Activate.ps1", 0, 9100),
    ("whitespace: tabs", Path("/usr/share/zoneinfo/zone1970.tab"), 0, 5000),
    ("whitespace: long space runs", VIM / "tutor", 0, 6000),
    ("emoji", EMOJI, 1, 9000),
    ("Japanese", VIM / "tutor.ja.utf-8", 0, 2500),
    ("Korean", VIM / "tutor.ko.utf-8", 0, 2500),
    ("Russian", VIM / "tutor.ru.utf-8", 0, 2500),
    ("Greek", VIM / "tutor.el.utf-8", 0, 2500),
    ("German", VIM / "tutor.de.utf-8", 0, 2000),
    ("Vietnamese", VIM / "tutor.vi.utf-8", 0, 2000),
    ("Turkish", VIM / "tutor.tr.utf-8", 0, 1500),
]


def prefix(path, start, limit):
    lines = path.read_bytes().splitlines(keepends=True)[start:]
    out = b""
    for line in lines:
        if len(out) + len(line) > limit:
            break
        out += line
    out.decode("utf-8")  # every part is valid UTF-8
    return out


def main():
    out = b""
    for name, path, start, limit in PARTS:
        out += f"==== {name} ====\n".encode() + prefix(path, start, limit)
    Path(__file__).with_name("corpus.txt").write_bytes(out)
    print(f"corpus.txt: {len(out)} bytes")


if __name__ == "__main__":
    main()
