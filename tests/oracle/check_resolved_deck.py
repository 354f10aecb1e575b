#!/usr/bin/env python3
"""Oracle: the resolved deck that `dstrain check --deck-out` writes is standard YAML
(PyYAML, an independent parser, reads it), has every section of the schema, and keeps
every value the input deck (also read by PyYAML) set, with overrides applied.

usage: check_resolved_deck.py DSTRAIN DECK OUT
"""
import subprocess
import sys

import yaml

SECTIONS = ["run", "model", "data", "training", "parallel", "kernels", "checkpoint",
            "logging", "eval", "debug"]
OVERRIDES = {"training.max_steps": 17, "training.optimizer.betas": [0.85, 0.99],
             "run.name": "oracle run"}


def flatten(node, prefix=""):
    out = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def main():
    dstrain, deck, out = sys.argv[1:4]
    cmd = [dstrain, "check", deck, "--deck-out", out]
    for path, value in OVERRIDES.items():
        text = yaml.safe_dump(value, default_flow_style=True).strip()
        if text.endswith("..."):
            text = text[:-3].strip()
        cmd += ["--set", f"{path}={text}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(deck) as f:
        given = flatten(yaml.safe_load(f))
    with open(out) as f:
        resolved_tree = yaml.safe_load(f)
    resolved = flatten(resolved_tree)
    problems = [f"missing section {s}" for s in SECTIONS if s not in resolved_tree]
    problems += [f"unexpected section {s}" for s in resolved_tree if s not in SECTIONS]
    expected = dict(given)
    expected.update(OVERRIDES)
    expected["parallel.data"] = "auto"  # the deck says auto; the echo keeps it
    for path, value in expected.items():
        if path not in resolved:
            problems.append(f"{path}: missing from the resolved deck")
        elif resolved[path] != value:
            problems.append(f"{path}: input {value!r}, resolved {resolved[path]!r}")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"resolved deck agrees: {len(expected)} given values, {len(resolved)} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
