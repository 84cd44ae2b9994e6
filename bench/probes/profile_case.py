"""Runs one bench shape a few times, for Nsight Compute:

    ncu --clock-control none -k regex:"tree_attn|merge" --launch-skip 2 --launch-count 2 \\
        python -m bench.probes.profile_case --batch 1 --seq-len 4096 --drafts 8 --heads 32/8/128
"""

import argparse

import torch

from ..methods import prepare_verify_ops
from ..workload import Shape, make_workload


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--drafts", type=int, default=8)
    p.add_argument("--heads", default="32/8/128", help="Hq/Hkv/head_dim")
    p.add_argument("--layout", default="fragmented")
    p.add_argument("--calls", type=int, default=3)
    args = p.parse_args()
    hq, hkv, hd = (int(x) for x in args.heads.split("/"))
    shape = Shape(args.batch, args.seq_len, args.drafts, hq, hkv, hd, args.layout)
    call = prepare_verify_ops(make_workload(shape, num_layers=1))[0]
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
