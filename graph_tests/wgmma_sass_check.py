"""Scans the built extension's SASS for wgmma register hazards.

    python graph_tests/wgmma_sass_check.py            # cuobjdump on verify_ops' _C
    python graph_tests/wgmma_sass_check.py --sass FILE

A warpgroup MMA (HGMMA) reads its A registers and writes its accumulators
after it issues; until a `WARPGROUP.DEPBAR` retires its group, no other
instruction may write them. ptxas (CUDA 13.0) once broke that at head_dim 64
(Q's A registers reused inside the loop: wrong results), so each toolchain's
output is checked here. The scan follows the fall-through path, taking
forward unconditional branches, which is the steady state of the KV loop.
Exits 1 on a hazard, or when no kernel has an HGMMA (an sm_90a build has some).
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(\S.*?)\s*;")
# Register-writing instructions whose destination comes first; stores,
# branches, barriers, compares into predicates and async copies write none.
_NO_REGISTER_DEST = ("ST", "BRA", "BAR", "RED", "ATOM", "LDGSTS", "ISETP", "FSETP",
                     "WARPSYNC", "HGMMA")


def kernels(sass: str):
    """(name, [(address, instruction)]) for each function in cuobjdump output."""
    for chunk in re.split(r"\n\s+Function : ", sass)[1:]:
        name, body = chunk.split("\n", 1)
        code = []
        for line in body.split("\n"):
            m = _INSTRUCTION.match(line)
            if m:
                code.append((int(m.group(1), 16), re.sub(r"\s+", " ", m.group(2))))
        yield name.strip(), code


def hazards(code):
    """Instructions that write a register an in-flight HGMMA still owns."""
    groups, current, found, skip_to = [], set(), [], None
    for address, ins in code:
        if skip_to is not None:
            if address < skip_to:
                continue
            skip_to = None
        jump = re.match(r"BRA 0x([0-9a-f]+)", ins)
        if jump and int(jump.group(1), 16) > address:
            skip_to = int(jump.group(1), 16)
            continue
        wait = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", ins)
        if wait:
            keep = int(wait.group(1))
            groups = groups[len(groups) - keep:] if keep else []
            continue
        mma = re.match(r"HGMMA\.64x(\d+)\S* R(\d+), (?:R(\d+), )?", ins)
        if mma:
            # 64 x N fp32 accumulators over 128 threads: N / 2 registers each.
            current |= {int(mma.group(2)) + i for i in range(int(mma.group(1)) // 2)}
            if mma.group(3):
                current |= {int(mma.group(3)) + i for i in range(4)}
            if "gsb0" in ins:
                groups.append(current)
                current = set()
            continue
        dest = re.match(r"(?:@!?U?P\w+ )?([A-Z][A-Z0-9._]*) R(\d+)\b", ins)
        if dest and not dest.group(1).startswith(_NO_REGISTER_DEST):
            if int(dest.group(2)) in set().union(*groups, current):
                found.append(f"{address:#06x}: {ins}")
    return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sass", type=Path, help="cuobjdump -sass output to scan")
    args = p.parse_args(argv)
    if args.sass:
        sass = args.sass.read_text()
    else:
        import verify_ops._C as ext
        sass = subprocess.run(["cuobjdump", "-sass", ext.__file__], check=True,
                              capture_output=True, text=True).stdout
    checked, bad = 0, 0
    for name, code in kernels(sass):
        if not any("HGMMA" in ins for _, ins in code):
            continue
        checked += 1
        found = hazards(code)
        bad += bool(found)
        print(f"{'HAZARD' if found else 'ok':6s} {name}", *found[:4], sep="\n  " if found else " ")
    print(f"{checked} wgmma kernels scanned, {bad} with hazards")
    return 1 if bad or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
