#!/usr/bin/env python3
"""Checks spack.yaml against the structure of Spack's environment schema (the keys and
value types Spack accepts), that every spec parses as a Spack spec string, and that it
lists what the build needs. Spack itself is not on PyPI; this is the subset of its
schema (spack/schema/env.py, definitions.py) that our file uses.

usage: check_spack_yaml.py SPACK_YAML
"""
import re
import sys

import yaml

ENV_KEYS = {"specs", "definitions", "view", "concretizer", "packages", "config",
            "include", "modules", "mirrors", "repos", "compilers", "upstreams",
            "develop", "container", "toolchains"}
DEFINITION_CONDITION_VARS = {"platform", "os", "target", "arch", "arch_str", "re", "env",
                             "hostname"}
# name[@version-range][+variant|~variant|key=value ...]
SPEC = re.compile(r"^[a-z0-9][a-z0-9_-]*(@[0-9A-Za-z.:,_-]*)?"
                  r"(\s*([+~][a-z0-9_-]+|[a-z0-9_]+=[A-Za-z0-9_.,:-]+))*$")
NEEDED = {"openmpi", "hdf5", "kokkos", "yaml-cpp", "openblas", "pcre2", "googletest",
          "benchmark", "cmake", "cuda", "nccl"}


def main():
    with open(sys.argv[1]) as f:
        doc = yaml.safe_load(f)
    problems = []
    if set(doc) != {"spack"}:
        problems.append(f"top level must be exactly 'spack', got {sorted(doc)}")
    env = doc.get("spack", {})
    problems += [f"unknown environment key '{k}'" for k in env if k not in ENV_KEYS]
    names = {}
    for entry in env.get("definitions", []):
        when = entry.get("when")
        lists = {k: v for k, v in entry.items() if k != "when"}
        if len(lists) != 1:
            problems.append(f"a definition entry must name one list: {entry}")
        if when is not None:
            try:
                compile(when, "when", "eval")
            except SyntaxError as e:
                problems.append(f"'when' is not a Python expression: {when} ({e})")
            used = set(re.findall(r"\b([a-z_]+)\s*[.(\[]", when)) - {"get"}
            problems += [f"'when' uses unknown variable {u}" for u in used
                         if u not in DEFINITION_CONDITION_VARS]
        for name, specs in lists.items():
            if not isinstance(specs, list):
                problems.append(f"definition {name} must be a list")
                continue
            names.setdefault(name, []).extend(specs)
    all_specs = []
    for item in env.get("specs", []):
        if item.startswith("$"):
            if item[1:] not in names:
                problems.append(f"spec list {item} is not defined")
            else:
                all_specs += names[item[1:]]
        else:
            all_specs.append(item)
    for spec in all_specs:
        if not isinstance(spec, str):
            problems.append(f"spec is not a string (quote specs ending in ':'): {spec!r}")
        elif not SPEC.match(spec):
            problems.append(f"not a valid spec string: '{spec}'")
    present = {re.split(r"[@+~ ]", s)[0] for s in all_specs if isinstance(s, str)}
    problems += [f"missing package {p}" for p in sorted(NEEDED - present)]
    if not isinstance(env.get("view", True), (bool, str, dict)):
        problems.append("view must be a boolean, a path or a mapping")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"spack.yaml ok: {len(all_specs)} specs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
