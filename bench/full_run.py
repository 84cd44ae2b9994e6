"""The committed H200 kernel table, reproduced: every part of the full run, in order.

    python -m bench.full_run              # all parts; JSON and PNG per part in bench_out/full_run/
    python -m bench.full_run --part 3     # one part (the lent H200 allows 10 minutes a call)
    python -m bench.full_run --list       # the parts and their exact commands
    python -m bench.full_run --readme     # the README's table: its rows, every method

Each part is one ``bench.bench_tree_attn`` (or ``bench.probes.floor_probe``)
command: together they time all 250 cases of the table for verify_ops,
FlashInfer and FA3 (where it was brought: bench/device/fa3_payload.sh), and the
slower baselines where the targets need them (Triton and
SDPA at batch 1, 64k, every D; at D8 elsewhere). A part should fit one device
call: its cases' ``elapsed_s`` say how long each took, to re-cut the parts by.
``bench/results/README.md`` names the part behind each committed file.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str
    module: str      # "bench_tree_attn" or "probes.floor_probe", under bench.
    args: tuple[str, ...]

    def argv(self, out_dir: str) -> list[str]:
        """The part's command-line arguments, writing under ``out_dir``."""
        out = ["--out", os.path.join(out_dir, f"{self.name}.json")]
        if self.module == "bench_tree_attn":
            out += ["--plot", os.path.join(out_dir, f"{self.name}.png")]
        return [*self.args, *out]


BASELINES = "verify_ops,flashinfer,fa3,triton,sdpa"

# Flex compiles once per case (tens of seconds), so it runs on a sample: every
# head shape at D8 and D64, batch 1, 4k and 64k, beside verify_ops alone.
PARTS = (
    Part("bs1-4k16k", "bench_tree_attn",
         ("--batches", "1", "--contexts", "4096,16384", "--methods", BASELINES,
          "--baseline-batches", "1", "--baseline-drafts", "4,8,64")),
    Part("bs1-64k", "bench_tree_attn",
         ("--batches", "1", "--contexts", "65536", "--methods", BASELINES,
          "--baseline-batches", "1", "--baseline-drafts", "4,8,16,32,64")),
    Part("bs1-128k256k", "bench_tree_attn",
         ("--batches", "1", "--contexts", "131072,262144",
          "--methods", "verify_ops,flashinfer,fa3,triton", "--baseline-batches", "1",
          "--baseline-drafts", "8", "--baseline-contexts", "131072,262144")),
    Part("bs8-4k-64k", "bench_tree_attn",
         ("--batches", "8", "--contexts", "4096,16384,65536", "--methods", BASELINES,
          "--baseline-batches", "8", "--baseline-drafts", "8")),
    Part("bs8-128k256k", "bench_tree_attn",
         ("--batches", "8", "--contexts", "131072,262144",
          "--methods", "verify_ops,flashinfer,fa3")),
    Part("flex", "bench_tree_attn",
         ("--batches", "1", "--contexts", "4096,65536", "--drafts", "8,64",
          "--methods", "verify_ops,flex", "--every-case-methods", "verify_ops",
          "--baseline-batches", "1", "--baseline-drafts", "8,64",
          "--baseline-contexts", "4096,65536")),
    Part("floor-bs1-4k", "probes.floor_probe", ("--batches", "1", "--contexts", "4096")),
)

# The README's table: every method on each of its rows, in one run (one device call).
README_METHODS = "verify_ops,flashinfer,fa3,triton,sdpa"
README_CASES = (
    "1/4096/4/32/8/128/fragmented/chain", "1/4096/8/32/8/128/fragmented",
    "1/65536/4/32/8/128/fragmented/chain", "1/65536/8/32/8/128/fragmented",
    "1/131072/8/32/8/128/fragmented", "1/4096/8/8/1/128/fragmented",
    "1/65536/8/8/1/128/fragmented", "1/262144/8/8/1/128/fragmented",
    "1/65536/8/16/2/256/fragmented", "1/65536/8/32/4/64/fragmented",
    "1/65536/64/32/8/128/fragmented", "1/65536/64/64/8/128/fragmented",
    "8/65536/8/32/8/128/fragmented",
)
README_PART = Part("readme", "bench_tree_attn",
                   ("--cases", ",".join(README_CASES), "--methods", README_METHODS,
                    "--every-case-methods", README_METHODS))


def command(part: Part, out_dir: str) -> str:
    return " ".join(["python -m", f"bench.{part.module}", *part.argv(out_dir)])


def run(part: Part, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    print(f"=== part {part.name}: {command(part, out_dir)}", flush=True)
    if part.module == "bench_tree_attn":
        from . import bench_tree_attn as module
    else:
        from .probes import floor_probe as module
    module.main(part.argv(out_dir))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--part", type=int, choices=range(1, len(PARTS) + 1),
                       help="run only this part (1-based; --list shows them)")
    which.add_argument("--readme", action="store_true",
                       help="run the README table's cases with every method instead of the parts")
    p.add_argument("--list", action="store_true", help="print the parts' commands and exit")
    p.add_argument("--out-dir", default="bench_out/full_run")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.list:
        for i, part in enumerate(PARTS, 1):
            print(f"{i}. {part.name}: {command(part, args.out_dir)}")
        print(f"readme: {command(README_PART, args.out_dir)}")
        return
    if args.readme:
        run(README_PART, args.out_dir)
        return
    for part in ([PARTS[args.part - 1]] if args.part else PARTS):
        run(part, args.out_dir)


if __name__ == "__main__":
    main()
