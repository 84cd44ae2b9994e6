"""One long-context tree verify, run under compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck python graph_tests/sanitize_case.py

Covers the split-KV path (a long request), the direct-write path (a short
one), an empty prefix, and GQA with a partial M tile; exits non-zero if the
result is wrong.
"""

import sys

import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref


def main():
    case = make_case([40_000, 0, 3], 16, 12, 2, 128, device="cuda", tree="eagle", seed=1)
    out = torch.full_like(case.q, float("nan"))
    verify_ops.tree_attn_out(*case.args(), out)
    torch.cuda.synchronize()
    err = relative_error(out, tree_attn_ref(*case.args()))
    print(f"relative error {err:.3g}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
