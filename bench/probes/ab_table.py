"""The table of an A/B (bench/probes/ab_run.sh): per case, each build's times over
the rounds, and the speedup of the candidate (base median / candidate median).

    python -m bench.probes.ab_table OUT/ab-base-r1.json OUT/ab-cand-r1.json ...
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys


def times_by_build(paths: list[str]) -> dict[str, dict[str, list[float]]]:
    """{build: {case label: [µs per round]}} from files named ab-<build>-r<round>.json."""
    builds: dict[str, dict[str, list[float]]] = {}
    for path in sorted(paths):
        match = re.search(r"ab-(\w+)-r(\d+)\.json$", path)
        if not match:
            raise ValueError(f"not an A/B result file (ab-<build>-r<round>.json): {path}")
        with open(path) as f:
            rows = json.load(f)["rows"]
        cases = builds.setdefault(match.group(1), {})
        for row in rows:
            us = row["methods"]["verify_ops"].get("us")
            if us is not None:
                cases.setdefault(row["label"], []).append(us)
    return builds


def format_ab(builds: dict[str, dict[str, list[float]]], base="base", cand="cand") -> str:
    lines = [f"{'case':34} {base + ' us':>18} {cand + ' us':>18} {'speedup':>8}"]
    ratios = []
    for label, base_us in builds.get(base, {}).items():
        cand_us = builds.get(cand, {}).get(label)
        if not cand_us:
            continue
        ratio = statistics.median(base_us) / statistics.median(cand_us)
        ratios.append(ratio)
        lines.append(f"{label:34} {' '.join(f'{t:.2f}' for t in base_us):>18} "
                     f"{' '.join(f'{t:.2f}' for t in cand_us):>18} {ratio:>8.3f}")
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"geometric mean speedup {geomean:.3f} over {len(ratios)} cases "
                     f"({sum(r >= 1 for r in ratios)} at >= 1)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_ab(times_by_build(sys.argv[1:])))
