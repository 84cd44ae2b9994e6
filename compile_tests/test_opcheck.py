"""torch.library.opcheck on both variants: schema, fake kernel, autograd registration, aot dispatch."""

import pytest
import torch

from verify_ops.cases import make_case

SHAPES = [
    # seq_lens, D, Hq, Hkv, head_dim, dtype
    ([0, 1, 40], 4, 4, 2, 64, torch.bfloat16),
    ([17], 8, 8, 1, 128, torch.float16),
    ([3, 0], 2, 16, 16, 64, torch.bfloat16),
    ([9, 65, 2, 30], 16, 4, 4, 256, torch.bfloat16),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("strided_q", [False, True])
def test_opcheck_functional(device, shape, strided_q):
    lens, num_drafts, hq, hkv, head_dim, dtype = shape
    case = make_case(lens, num_drafts, hq, hkv, head_dim, dtype=dtype, device=device,
                     strided_q=strided_q, seed=len(lens))
    torch.library.opcheck(torch.ops.verify.tree_attn.default, case.args())


@pytest.mark.parametrize("shape", SHAPES)
def test_opcheck_out(device, shape):
    lens, num_drafts, hq, hkv, head_dim, dtype = shape
    case = make_case(lens, num_drafts, hq, hkv, head_dim, dtype=dtype, device=device,
                     seed=3 * len(lens))
    out = torch.empty_like(case.q)
    torch.library.opcheck(torch.ops.verify.tree_attn_out.default, (*case.args(), out))
