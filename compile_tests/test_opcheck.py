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


OPTION_CASES = {
    "fp8 scales": dict(kv_dtype=torch.float8_e4m3fn, kv_scales=True),
    "window sinks": dict(sliding_window=7, sinks=True),
    "everything": dict(kv_dtype=torch.float8_e5m2, kv_scales=True, logit_cap=20.0, sinks=True,
                       sliding_window=30),
}


@pytest.mark.parametrize("name", list(OPTION_CASES))
def test_opcheck_options(device, name):
    case = make_case([0, 1, 40], 4, 8, 2, 64, device=device, seed=5, **OPTION_CASES[name])
    # test_schema's mutation check multiplies inputs, which torch 2.14 does not do
    # on float8 tensors; the other checks run on every case.
    utils = [u for u in torch.library._OPCHECK_DEFAULT_UTILS
             if u != "test_schema" or case.k_cache.element_size() > 1]
    torch.library.opcheck(torch.ops.verify.tree_attn.default, case.args(), case.options,
                          test_utils=utils)
    out = torch.empty_like(case.q)
    lse = torch.empty(case.q.shape[:2], device=case.q.device)
    torch.library.opcheck(torch.ops.verify.tree_attn_out.default, (*case.args(), out),
                          dict(case.options, lse=lse), test_utils=utils)
