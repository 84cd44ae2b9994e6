"""Registers and spills per kernel, from a build log made with
VERIFY_OPS_PTXAS_VERBOSE=1, and with --base the change against another build
(the restructure's before and after, say).

    python -m bench.probes.ptxas_table build-cand.log [--base build-base.log] [--arch sm_90a] [--out F]

Kernels match by their short names (kernel_names.variant): a kernel of a
build from before the option kernels, which lacks their template arguments,
matches the plain kernel of the same tile.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess

from .kernel_names import variant

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def demangle(names: list[str]) -> list[str]:
    if not names or not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def parse_log(text: str, arch: str = "sm_90a") -> dict[str, dict[str, int]]:
    """{kernel: {registers, stack, spill_stores, spill_loads}} for one arch's kernels."""
    mangled, stats, current = [], [], None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = {} if m.group(2) == arch else None
            if current is not None:
                mangled.append(m.group(1))
                stats.append(current)
        elif current is not None and (m := _SPILL.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
        elif current is not None and (m := _REGS.search(line)):
            current["registers"] = int(m.group(1))
            current = None
    return {variant(n) or n: s for n, s in zip(demangle(mangled), stats)}


def compare(base: dict, cand: dict) -> dict:
    """Per kernel of both builds the pair (base, cand), and the kernels only one has."""
    both = sorted(set(base) & set(cand))
    changed = {k: {"base": base[k], "cand": cand[k]} for k in both if base[k] != cand[k]}
    return {"matched": len(both), "changed": changed,
            "only_base": sorted(set(base) - set(cand)), "only_cand": sorted(set(cand) - set(base))}


def _fmt(s: dict) -> str:
    return f"{s.get('registers', '?'):>3} regs, spill {s.get('spill_stores', 0)}/{s.get('spill_loads', 0)}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log")
    p.add_argument("--base", default="")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--out", default="")
    args = p.parse_args()
    cand = parse_log(open(args.log).read(), args.arch)
    result = {"arch": args.arch, "kernels": cand}
    if args.base:
        base = parse_log(open(args.base).read(), args.arch)
        result.update(base_kernels=base, comparison=compare(base, cand))
        c = result["comparison"]
        for name, pair in c["changed"].items():
            print(f"{name:60s} {_fmt(pair['base'])} -> {_fmt(pair['cand'])}")
        print(f"{c['matched']} kernels in both builds, {len(c['changed'])} changed; "
              f"{len(c['only_cand'])} only in the candidate, {len(c['only_base'])} only in the base")
    else:
        for name, s in sorted(cand.items()):
            print(f"{name:60s} {_fmt(s)}")
    spilling = {k: s for k, s in cand.items() if s.get("spill_stores", 0) or s.get("spill_loads", 0)}
    print(f"{len(cand)} {args.arch} kernels, {len(spilling)} spill")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
