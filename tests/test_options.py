"""The op's keyword options against the float64 reference: fp8 KV with scales,
soft-cap, sinks, the sliding window by logical position, the LSE output and
paged pools, alone and combined as real models combine them."""

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.trees import eagle_tree, mask_depths, parents_to_mask

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def tolerance(case) -> float:
    return 1e-5 if case.q.dtype == torch.float32 else 1e-2


def run_out(case, **extra):
    """tree_attn_out into NaN-poisoned out and lse; both must be fully written."""
    out = torch.full_like(case.q, float("nan"))
    lse = torch.full(case.q.shape[:2], float("nan"), device=case.q.device)
    verify_ops.tree_attn_out(*case.args(), out, **case.options, **extra, lse=lse)
    assert not out.isnan().any() and not lse.isnan().any()
    return out, lse


def check(case, **extra):
    out, lse = run_out(case, **extra)
    ref, ref_lse = verify_ops.tree_attn_ref(*case.args(), **case.options, **extra,
                                            return_lse=True)
    assert verify_ops.relative_error(out, ref) < tolerance(case)
    # LSE in natural-log units; -inf exactly where the reference row sees nothing.
    assert torch.equal(lse.isinf().cpu(), ref_lse.isinf().cpu())
    finite = ref_lse.isfinite()
    assert torch.allclose(lse.double()[finite], ref_lse[finite], atol=2e-3, rtol=1e-4)


# Each option alone, on ragged prefixes (0 and 1 included), random trees,
# fragmented slots and strided q.
OPTIONS = {
    "kv_scales": dict(kv_scales=True),
    "logit_cap": dict(logit_cap=3.0),
    "sinks": dict(sinks=True),
    "window 0": dict(sliding_window=0),
    "window 5": dict(sliding_window=5),
    "window 64": dict(sliding_window=64),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_option(device, name, dtype):
    case = make_case([0, 1, 90, 33], 6, 8, 2, 64, dtype=dtype, device=device,
                     strided_q=True, seed=7, **OPTIONS[name])
    check(case)


# The scales, sinks and LSE alone run the plain mainloop on CUDA (the kTotals
# option kernels); a window or soft-cap, the full option kernels. The totals
# on each row tiling (16, 32, 64, 96 and 160 rows per KV head) and, one request
# on one KV head at 40k, past the few-split merge.
@pytest.mark.skipif(not verify_ops.has_cuda_kernel(), reason="needs a GPU and a CUDA build")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("num_drafts", [2, 4, 8, 12, 20])
def test_totals_on_every_row_tiling(head_dim, num_drafts):
    case = make_case([0, 1, 2500], num_drafts, 16, 2, head_dim, device="cuda", tree="random",
                     kv_scales=True, sinks=True, seed=num_drafts * 10 + head_dim)
    check(case)


@pytest.mark.skipif(not verify_ops.has_cuda_kernel(), reason="needs a GPU and a CUDA build")
@pytest.mark.parametrize("extra", [dict(sinks=True), dict(sliding_window=128, sinks=True)],
                         ids=["totals", "window"])
def test_options_past_the_few_split_merge(extra):
    """One request on one KV head at 40k: hundreds of splits without a window;
    a window's splits cover only its W + D positions."""
    case = make_case([40_000], 8, 4, 1, 128, device="cuda", tree="random", seed=5, **extra)
    check(case)


@pytest.mark.parametrize("kv_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_kv(device, kv_dtype, dtype, head_dim):
    case = make_case([0, 1, 150, 77], 8, 8, 1, head_dim, dtype=dtype, kv_dtype=kv_dtype,
                     device=device, kv_scales=True, seed=head_dim)
    check(case)


def test_fp8_kv_fp32_q_on_cpu():
    case = make_case([3, 40], 4, 4, 2, 32, dtype=torch.float32, kv_dtype=torch.float8_e4m3fn,
                     kv_scales=True, seed=2)
    check(case)


@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_pool(device, page_size):
    case = make_case([0, 1, 200, 64], 7, 8, 2, 64, device=device, layout="paged",
                     page_size=page_size, seed=page_size)
    check(case)


# The combinations real models run.
MODELS = {
    # gpt-oss: window 128 with sinks, head_dim 64 (64/8/64; 8/1/64 per TP8 rank).
    "gpt-oss TP8 rank": dict(shape=(8, 1, 64), tree="eagle", sinks=True, sliding_window=128),
    "gpt-oss": dict(shape=(64, 8, 64), tree="chain", sinks=True, sliding_window=128),
    # Grok: tanh soft-cap 30 over EAGLE trees.
    "grok": dict(shape=(16, 2, 128), tree="eagle", logit_cap=30.0),
    # An fp8 KV deployment with a window (Gemma-style layers) and a soft-cap.
    "fp8 window": dict(shape=(16, 2, 128), tree="random", kv_dtype=torch.float8_e4m3fn,
                       kv_scales=True, sliding_window=100, logit_cap=50.0),
    "everything paged": dict(shape=(8, 1, 64), tree="eagle", kv_dtype=torch.float8_e5m2,
                             kv_scales=True, sliding_window=40, logit_cap=20.0, sinks=True,
                             layout="paged", page_size=16),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_combination(device, name):
    options = dict(MODELS[name])
    hq, hkv, head_dim = options.pop("shape")
    case = make_case([0, 1, 300, 129], 8, hq, hkv, head_dim, device=device, seed=11,
                     **options)
    check(case)


def flattened_positions_ref(case, window):
    """What sglang #39160 / #39287 computed: draft j at seq_len + j, its flattened index."""
    q, k_cache, v_cache, r2t, rpi, lens, mask, scale = case.args()
    bs, num_drafts = mask.shape[0], mask.shape[1]
    group = q.shape[1] // k_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(bs):
        prefix = int(lens[b])
        slots = r2t[int(rpi[b]), : prefix + num_drafts].long().cpu()
        k = k_cache.cpu()[slots].double().repeat_interleave(group, 1)
        v = v_cache.cpu()[slots].double().repeat_interleave(group, 1)
        qb = q.cpu()[b * num_drafts:(b + 1) * num_drafts].double()
        pos = torch.arange(prefix + num_drafts)
        visible = torch.cat([torch.ones(num_drafts, prefix, dtype=torch.bool), mask[b].cpu()], 1)
        visible &= pos[None] >= (prefix + torch.arange(num_drafts))[:, None] - window
        scores = torch.einsum("ihd,thd->hit", qb, k) * scale
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num(0)
        out[b * num_drafts:(b + 1) * num_drafts] = torch.einsum("hit,thd->ihd", probs, v)
    return out.to(q.device)


def test_window_uses_tree_depth_not_flattened_index(device):
    """A wide EAGLE tree (topk 4): drafts 1-4 all sit at depth 1, one past the root,
    while their flattened indices run to 4. With W = 2 the flattened reading
    drops prefix keys that the depth reading keeps."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16  # CUDA runs 16-bit q
    case = make_case([40, 17], 10, 4, 1, 64, dtype=dtype, device=device, tree="chain", seed=5)
    parents = eagle_tree(4, 2, 10, torch.Generator().manual_seed(1))
    case.tree_mask = parents_to_mask(parents).expand(2, -1, -1).contiguous().to(device)
    assert mask_depths(case.tree_mask[0]).tolist()[:5] == [0, 1, 1, 1, 1]
    out = verify_ops.tree_attn(*case.args(), sliding_window=2)
    by_depth = verify_ops.tree_attn_ref(*case.args(), sliding_window=2)
    by_index = flattened_positions_ref(case, window=2)
    assert verify_ops.relative_error(out, by_depth) < (1e-5 if device == "cpu" else 1e-2)
    assert verify_ops.relative_error(by_index, by_depth) > 0.1  # the pitfall is visible here


def test_window_skips_keys_wholly_outside(device):
    """KV before seq_len - W is never read: poisoning it changes nothing."""
    case = make_case([500, 3], 4, 8, 2, 64, device=device, tree="chain", seed=3)
    expected = verify_ops.tree_attn(*case.args(), sliding_window=16)
    for b in range(2):
        prefix = int(case.seq_lens[b])
        row = case.req_to_token[int(case.req_pool_indices[b])]
        stale = row[: max(0, prefix - 16)].long()
        case.k_cache[stale] = float("nan")
        case.v_cache[stale] = float("nan")
    assert torch.equal(verify_ops.tree_attn(*case.args(), sliding_window=16), expected)


def test_sinks_only_row_keeps_sink_lse(device):
    """A draft that sees no key at all outputs zeros; its LSE is its sink's logit."""
    case = make_case([0], 3, 4, 2, 64, device=device, sinks=True, seed=9)
    case.tree_mask[0, 1] = False  # draft 1 sees nothing: empty prefix, empty mask row
    out, lse = run_out(case)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.allclose(lse[1], case.options["sinks"])
    check(case)


def test_return_lse_matches_out_variant(device):
    case = make_case([12, 0], 5, 8, 4, 64, device=device, sinks=True, logit_cap=10.0, seed=4)
    out, lse = verify_ops.tree_attn(*case.args(), **case.options, return_lse=True)
    out_b, lse_b = run_out(case)
    assert torch.equal(out, out_b) and torch.equal(lse, lse_b)


def test_defaults_are_plain_attention(device):
    case = make_case([33, 1, 0], 4, 8, 2, 64, device=device, seed=8)
    plain = verify_ops.tree_attn(*case.args())
    explicit = verify_ops.tree_attn(*case.args(), k_scale=None, v_scale=None, logit_cap=0.0,
                                    sinks=None, sliding_window=-1)
    assert torch.equal(plain, explicit)


def test_scales_are_read_at_call_time(device):
    """Scales are tensors: a new value in the same tensor changes the result
    (a captured graph sees it without a recapture)."""
    case = make_case([50], 4, 8, 8, 64, kv_dtype=torch.float8_e4m3fn, device=device,
                     kv_scales=True, seed=12)
    first = verify_ops.tree_attn(*case.args(), **case.options)
    case.options["v_scale"].mul_(2)
    second = verify_ops.tree_attn(*case.args(), **case.options)
    assert torch.allclose(second.float(), 2 * first.float(), rtol=1e-2, atol=1e-3)
