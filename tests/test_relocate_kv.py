"""verify.relocate_kv against a plain index copy, opcheck, torch.compile, and bad input."""

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case

needs_cuda = pytest.mark.skipif(not verify_ops.has_cuda_kernel(),
                                reason="needs a GPU and a CUDA build of verify_ops")


def caches(num_layers, pool, k_row, v_row, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda row: [torch.randn(pool, *row, generator=gen).to(dtype).to(device)  # noqa: E731
                        for _ in range(num_layers)]
    return make(k_row), make(v_row)


def slot_pairs(pool, n, index_dtype, device, seed=0):
    """n distinct src slots and n distinct dst slots, disjoint, in random order."""
    perm = torch.randperm(pool, generator=torch.Generator().manual_seed(seed))
    return perm[:n].to(index_dtype).to(device), perm[n:2 * n].to(index_dtype).to(device)


def reference(tensors, src, dst):
    out = [t.clone() for t in tensors]
    for t in out:
        t[dst.long()] = t[src.long()]
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("k_row,v_row", [((2, 64), (2, 64)), ((8, 128), (8, 96)), ((1, 3), (3,))])
def test_matches_plain_copy(device, dtype, index_dtype, k_row, v_row):
    k, v = caches(3, 300, k_row, v_row, torch.float32, device)
    k, v = [t.to(dtype) for t in k], [t.to(dtype) for t in v]
    src, dst = slot_pairs(300, 70, index_dtype, device)
    expected = reference(k + v, src, dst)
    verify_ops.relocate_kv(k, v, src, dst)
    for got, want in zip(k + v, expected):
        assert torch.equal(got, want)


def test_strided_slots_and_index_views(device):
    """Slot stride wider than a row (views of a fused buffer), strided index tensors."""
    fused = torch.randn(200, 4, 64, device=device).to(torch.bfloat16)
    k, v = [fused[:, :2]], [fused[:, 2:]]
    src, dst = slot_pairs(200, 40, torch.int64, device)
    pairs = torch.stack([src, dst], 1)
    assert pairs[:, 0].stride(0) == 2
    expected = reference([fused], src, dst)[0]
    verify_ops.relocate_kv(k, v, pairs[:, 0], pairs[:, 1])
    assert torch.equal(fused, expected)


def test_bumps_the_version_of_every_cache(device):
    k, v = caches(2, 50, (2, 8), (2, 8), torch.bfloat16, device)
    versions = [t._version for t in k + v]
    verify_ops.relocate_kv(k, v, *slot_pairs(50, 10, torch.int64, device))
    assert all(t._version > before for t, before in zip(k + v, versions))


def test_no_pairs_is_a_no_op(device):
    k, v = caches(2, 10, (2, 8), (2, 8), torch.bfloat16, device)
    before = [t.clone() for t in k + v]
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    verify_ops.relocate_kv(k, v, empty, empty)
    assert all(torch.equal(a, b) for a, b in zip(k + v, before))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_opcheck(device, index_dtype):
    k, v = caches(2, 64, (2, 32), (2, 16), torch.bfloat16, device)
    src, dst = slot_pairs(64, 20, index_dtype, device)
    torch.library.opcheck(torch.ops.verify.relocate_kv.default, (k, v, src, dst))


def test_torch_compile_fullgraph(device):
    def move(k, v, src, dst):
        verify_ops.relocate_kv(k, v, src, dst)
        return k[0].sum() + v[1].sum()

    k, v = caches(2, 50, (2, 16), (2, 16), torch.float32, device)
    src, dst = slot_pairs(50, 10, torch.int64, device)
    expected = reference(k + v, src, dst)
    torch._dynamo.reset()
    total = torch.compile(move, backend="aot_eager", fullgraph=True)(k, v, src, dst)
    for got, want in zip(k + v, expected):
        assert torch.equal(got, want)
    assert torch.allclose(total, expected[0].sum() + expected[3].sum())


def test_many_layers_take_several_launches(device):
    """Past 224 layers the CUDA kernel takes one launch per 448 caches."""
    k, v = caches(300, 8, (4,), (4,), torch.float32, device)
    src, dst = slot_pairs(8, 3, torch.int64, device)
    expected = reference(k + v, src, dst)
    verify_ops.relocate_kv(k, v, src, dst)
    assert all(torch.equal(a, b) for a, b in zip(k + v, expected))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_tree_attn_bitwise_identical_after_relocation(device, index_dtype):
    """Every request moved from scattered slots into one run each: the verify output
    depends on where a request's slots lie only through their values."""
    case = make_case([37, 0, 300, 5], 6, 8, 2, 64, device=device, index_dtype=index_dtype,
                     layout="fragmented", seed=11)
    before = verify_ops.tree_attn(*case.args())
    total = case.seq_lens + case.tree_mask.shape[1]
    rows = case.req_pool_indices.long()
    src = torch.cat([case.req_to_token[r, :n] for r, n in zip(rows.tolist(), total.tolist())])
    pool = case.k_cache.shape[0]
    grow = lambda c: torch.cat([c, torch.full_like(c[: src.numel()], float("nan"))])  # noqa: E731
    case.k_cache, case.v_cache = grow(case.k_cache), grow(case.v_cache)
    dst = torch.arange(pool, pool + src.numel(), device=device, dtype=src.dtype)
    verify_ops.relocate_kv([case.k_cache], [case.v_cache], src, dst)
    offset = 0
    for r, n in zip(rows.tolist(), total.tolist()):
        case.req_to_token[r, :n] = dst[offset: offset + n]
        offset += n
    assert torch.equal(verify_ops.tree_attn(*case.args()), before)


# -- bad input: the C++ kernel and the fake kernel say the same thing ---------

def base_args():
    k, v = caches(2, 16, (2, 8), (2, 8), torch.bfloat16, "cpu")
    src, dst = slot_pairs(16, 4, torch.int64, "cpu")
    return dict(k=k, v=v, src=src, dst=dst)


BAD = {
    "no layers": (lambda a: a.update(k=[], v=[]), r"k_caches must hold at least one layer, got 0"),
    "layer counts": (lambda a: a.update(v=a["v"][:1]),
                     r"v_caches must hold one cache per layer of k_caches \(2\), got 1"),
    "k dtype": (lambda a: a["k"].__setitem__(1, a["k"][1].half()),
                r"k_caches\[1\] must have the dtype of k_caches\[0\] \(BFloat16\), got Half"),
    "v dtype": (lambda a: a["v"].__setitem__(0, a["v"][0].float()),
                r"v_caches\[0\] must have the dtype of k_caches\[0\] \(BFloat16\), got Float"),
    "k shape": (lambda a: a["k"].__setitem__(1, a["k"][1][:, :1]),
                r"k_caches\[1\] must have the shape of k_caches\[0\] \(\[16, 2, 8\]\), "
                r"got \[16, 1, 8\]"),
    "pool sizes": (lambda a: a.update(v=[t[:10] for t in a["v"]]),
                   r"v_caches\[0\].size\(0\) must equal the pool size k_caches\[0\].size\(0\) "
                   r"= 16, got 10"),
    "row layout": (lambda a: a.update(k=[t.transpose(1, 2).contiguous().transpose(1, 2)
                                         for t in a["k"]]),
                   r"k_caches\[0\] must store each slot contiguously"),
    "scalar cache": (lambda a: a.update(k=[torch.zeros((), dtype=torch.bfloat16)] * 2),
                     r"k_caches\[0\] must be at least 1-D"),
    "src rank": (lambda a: a.update(src=a["src"][None]),
                 r"src_slots must be 1-D \[n\], got 2-D with shape \[1, 4\]"),
    "src dtype": (lambda a: a.update(src=a["src"].float()),
                  r"src_slots must have dtype int32 or int64, got Float"),
    "dst dtype": (lambda a: a.update(dst=a["dst"].to(torch.int16)),
                  r"dst_slots must have dtype int32 or int64, got Short"),
    "mixed index dtypes": (lambda a: a.update(dst=a["dst"].int()),
                           r"dst_slots must have the dtype of src_slots \(Long\), got Int"),
    "lengths": (lambda a: a.update(dst=a["dst"][:3]),
                r"dst_slots must have the length of src_slots \(4\), got 3"),
}


def call(args, on_meta):
    if on_meta:
        to_meta = lambda t: t.to("meta")  # noqa: E731
        args = dict(k=[to_meta(t) for t in args["k"]], v=[to_meta(t) for t in args["v"]],
                    src=to_meta(args["src"]), dst=to_meta(args["dst"]))
    torch.ops.verify.relocate_kv(args["k"], args["v"], args["src"], args["dst"])


@pytest.mark.parametrize("on_meta", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name, on_meta):
    args = base_args()
    mutate, message = BAD[name]
    mutate(args)
    with pytest.raises(RuntimeError, match="verify.relocate_kv: " + message):
        call(args, on_meta)


def test_fake_rejects_mixed_devices():
    args = base_args()
    k = [t.to("meta") for t in args["k"]]
    v = [t.to("meta") for t in args["v"]]
    with pytest.raises(RuntimeError, match=r"src_slots must be on the device of k_caches\[0\] "
                                           r"\(meta\), got cpu"):
        torch.ops.verify.relocate_kv(k, v, args["src"], args["dst"].to("meta"))


@needs_cuda
def test_cuda_rejects_mixed_devices():
    args = base_args()
    with pytest.raises(RuntimeError, match=r"k_caches\[1\] must be on the device of k_caches\[0\] "
                                           r"\(cuda:0\), got cpu"):
        torch.ops.verify.relocate_kv([args["k"][0].cuda(), args["k"][1]], [t.cuda() for t in
                                     args["v"]], args["src"].cuda(), args["dst"].cuda())


VALUE_ERRORS = {
    "src out of range": (lambda s, d: (s.clone().fill_(16), d),
                         r"src_slots must lie in \[0, 16\) \(the pool size\), got values in "
                         r"\[16, 16\]"),
    "dst negative": (lambda s, d: (s, d - 100), r"dst_slots must lie in \[0, 16\)"),
    "dst repeated": (lambda s, d: (s, d[[0, 1, 1, 3]]), r"dst_slots must not repeat a slot"),
    "overlap": (lambda s, d: (s, torch.cat([s[:1], d[1:]])),
                r"src_slots and dst_slots must be disjoint"),
}


@pytest.mark.parametrize("name", list(VALUE_ERRORS))
def test_value_checks(device, name, debug):
    """Under VERIFY_OPS_DEBUG=1 on every device; on CPU always (no device to sync with)."""
    if not debug and device != "cpu":
        pytest.skip("on CUDA the value checks sync, so they run only under VERIFY_OPS_DEBUG=1")
    args = base_args()
    k, v = [t.to(device) for t in args["k"]], [t.to(device) for t in args["v"]]
    src, dst = VALUE_ERRORS[name][0](args["src"].to(device), args["dst"].to(device))
    with pytest.raises(RuntimeError, match="verify.relocate_kv: " + VALUE_ERRORS[name][1]):
        verify_ops.relocate_kv(k, v, src, dst)


@needs_cuda
def test_cuda_offsets_beyond_int32():
    """A slot whose byte offset exceeds 2**31 needs 64-bit addressing."""
    pool = (2**31) // 256 + 4096  # 256-byte rows: [pool, 1, 128] bf16
    k = [torch.zeros(pool, 1, 128, dtype=torch.bfloat16, device="cuda")]
    v = [torch.zeros(pool, 1, 128, dtype=torch.bfloat16, device="cuda")]
    src = torch.tensor([1, pool - 1], device="cuda")
    dst = torch.tensor([pool - 2, 2], device="cuda")
    k[0][src] = torch.randn(2, 1, 128, device="cuda").to(torch.bfloat16)
    v[0][src] = torch.randn(2, 1, 128, device="cuda").to(torch.bfloat16)
    verify_ops.relocate_kv(k, v, src, dst)
    assert torch.equal(k[0][dst], k[0][src]) and torch.equal(v[0][dst], v[0][src])


@needs_cuda
def test_cuda_unaligned_rows_use_narrower_vectors():
    """Rows of 6 bytes (3 fp16): no 16-byte vectors, same result."""
    base = torch.randn(2, 101 * 3 + 1, device="cuda").half()
    k = [base[0, 1:].view(101, 3)]  # data pointer 2 bytes off a 16-byte boundary
    v = [base[1, 1:].view(101, 3)]
    src, dst = slot_pairs(101, 30, torch.int32, "cuda")
    expected = reference(k + v, src, dst)
    verify_ops.relocate_kv(k, v, src, dst)
    assert all(torch.equal(a, b) for a, b in zip(k + v, expected))
