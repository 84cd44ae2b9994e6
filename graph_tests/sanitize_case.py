"""Tree verifies run under compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck python graph_tests/sanitize_case.py [INDEX ...]

Covers the split-KV path (long requests), the direct-write path (short ones),
an empty prefix, GQA with a partial 128-row tile (on sm_90a two warpgroups
of wgmma fed by a producer warpgroup through mbarriers, at head_dim 64 and
128 taking turns on the tensor cores, at 256 past 128 rows), a four-warp wgmma
tile (two of them for the 128 rows of a single (request, KV head)), wgmma
with Q from shared memory (head_dim 256), the key-split warps (2 and 4 warps
share a KV tile), both merge kernels (the few-split one, and past its
capacity the split-parallel one) and splits that merge inside their cluster;
the option kernels (fp8 KV in both formats, the window, sinks, soft-cap and
LSE, through the direct, few-split and split-parallel paths); exits non-zero
if a result is wrong.
INDEX picks cases of CASES (0-based) where a tool is too slow for all.
"""

import sys

import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref


# (prefix lengths, D, Hq, Hkv, head_dim[, make_case options])
ALL_OPTIONS = dict(kv_scales=True, sinks=True, logit_cap=30.0, sliding_window=100)
CASES = [
    ([40_000, 0, 3], 16, 12, 2, 128),  # 96 rows: one 128-row tile; wgmma
    ([9_000, 2], 8, 16, 2, 64),        # 64 rows: one four-warp wgmma tile
    ([3_000, 5], 20, 16, 2, 64),       # 160 rows: two 128-row tiles at head_dim 64
    ([7_000, 1], 12, 16, 2, 256),      # 96 rows: one 128-row tile at head_dim 256
    ([4_000, 0], 20, 16, 2, 256),      # 160 rows: the producer kernel at head_dim 256
    ([40_000], 8, 4, 1, 128),          # 32 rows: key split 2; 264 splits (split-parallel merge)
    ([5_000, 0], 8, 4, 4, 64),         # 8 rows: key split 4; <= 64 splits
    ([30_000], 16, 8, 1, 128),         # 128 rows of one (request, KV head): two four-warp tiles
    # Eight requests on eight KV heads, or on two at head_dim 256: a few splits
    # per (request, KV head) that merge inside their cluster.
    ([6_000, 0, 1, 256, 2_500, 4_000, 64, 9_000], 8, 32, 8, 128),   # key split 2
    ([3_000, 5, 700, 4_100, 128, 8_000, 2, 900], 16, 64, 8, 128),   # the producer kernel
    ([5_000, 3, 900, 2_000, 100, 7_000, 1, 4_000], 16, 16, 2, 256),  # the eight-warp kernel
    # The option kernels.
    ([9_000, 0, 40], 8, 8, 1, 64, ALL_OPTIONS),                         # window: one split
    ([40_000, 1], 16, 8, 1, 128, dict(ALL_OPTIONS, sliding_window=-1)),  # split-parallel merge
    ([3_000, 7], 8, 4, 4, 64, dict(kv_dtype=torch.float8_e4m3fn, kv_scales=True)),  # key split 4
    ([20_000, 2], 8, 32, 4, 128, dict(ALL_OPTIONS, kv_dtype=torch.float8_e5m2)),  # 64-row fp8
    ([6_000, 0], 16, 8, 2, 256, dict(ALL_OPTIONS, kv_dtype=torch.float8_e4m3fn)),  # fp8 at 256
    ([5_000, 9], 16, 64, 8, 128, dict(logit_cap=20.0, sinks=True)),     # the producer kernel
    # Scales and sinks alone: the plain mainloop with the option epilogue (kTotals).
    ([30_000, 1], 16, 8, 1, 128, dict(kv_scales=True, sinks=True)),    # two four-warp tiles
    ([5_000, 9], 16, 64, 8, 128, dict(sinks=True)),                    # the producer kernel
]


def main(picked):
    unknown = sorted(picked - set(range(len(CASES))))
    if unknown:
        sys.exit(f"sanitize_case.py: no case {unknown}; CASES has 0..{len(CASES) - 1}")
    worst = 0.0
    for seed, (lens, drafts, hq, hkv, head_dim, *options) in enumerate(CASES):
        if picked and seed not in picked:
            continue
        case = make_case(lens, drafts, hq, hkv, head_dim, device="cuda", tree="eagle", seed=seed,
                         **(options[0] if options else {}))
        out = torch.full_like(case.q, float("nan"))
        verify_ops.tree_attn_out(*case.args(), out, **case.options)
        torch.cuda.synchronize()
        ref = tree_attn_ref(*case.args(), **case.options)
        error = relative_error(out, ref)
        worst = max(worst, error)
        # One line per case as it passes: a sanitizer run cut off by its time
        # limit still shows how far it got.
        print(f"case {seed}: relative error {error:.3g}", flush=True)
    print(f"relative error {worst:.3g}")
    return 0 if worst < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main({int(arg) for arg in sys.argv[1:]}))
