"""Bad input gets a clear error naming the argument, from the C++ kernel and the fake kernel alike."""

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case


def base_args():
    case = make_case([5, 0], 4, 8, 2, 64, seed=1)
    return dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache,
                req_to_token=case.req_to_token, req_pool_indices=case.req_pool_indices,
                seq_lens=case.seq_lens, tree_mask=case.tree_mask, sm_scale=case.sm_scale)


BAD = {
    "q dtype": (lambda a: a.update(q=a["q"].to(torch.int32)), r"q must have dtype bfloat16 or float16"),
    "k dtype": (lambda a: a.update(k_cache=a["k_cache"].half()),
                r"k_cache must have the dtype of q \(BFloat16\) or be float8_e4m3fn or "
                r"float8_e5m2, got Half"),
    "v dtype": (lambda a: a.update(v_cache=a["v_cache"].half()),
                r"v_cache must have the dtype of k_cache \(BFloat16\), got Half"),
    "fp8 k only": (lambda a: a.update(k_cache=a["k_cache"].to(torch.float8_e4m3fn)),
                   r"v_cache must have the dtype of k_cache \(Float8_e4m3fn\), got BFloat16"),
    "q rank": (lambda a: a.update(q=a["q"].flatten(1)), r"q must be 3-D"),
    "k rank": (lambda a: a.update(k_cache=a["k_cache"][0]), r"k_cache must be 3-D"),
    "r2t rank": (lambda a: a.update(req_to_token=a["req_to_token"].flatten()), r"req_to_token must be 2-D"),
    "r2t dtype": (lambda a: a.update(req_to_token=a["req_to_token"].float()),
                  r"req_to_token must have dtype int32 or int64, got Float"),
    "rpi dtype": (lambda a: a.update(req_pool_indices=a["req_pool_indices"].to(torch.int16)),
                  r"req_pool_indices must have dtype int32 or int64"),
    "lens dtype": (lambda a: a.update(seq_lens=a["seq_lens"].float()), r"seq_lens must have dtype int32 or int64"),
    "mask dtype": (lambda a: a.update(tree_mask=a["tree_mask"].to(torch.uint8)),
                   r"tree_mask must have dtype bool, got Byte"),
    "rpi bs": (lambda a: a.update(req_pool_indices=a["req_pool_indices"][:1]),
               r"req_pool_indices must have bs = seq_lens.size\(0\) = 2 entries, got 1"),
    "mask bs": (lambda a: a.update(tree_mask=a["tree_mask"][:1]), r"tree_mask.size\(0\) must equal bs"),
    "q rows": (lambda a: a.update(q=a["q"][:7]), r"q.size\(0\) must be a multiple of bs = 2, got 7"),
    "mask D": (lambda a: a.update(tree_mask=a["tree_mask"][:, :3, :3]),
               r"tree_mask must have shape \[bs, D, D\] = \[2, 4, 4\]"),
    "gqa": (lambda a: a.update(q=a["q"][:, :3]),
            r"Hq \(q.size\(1\) = 3\) must be a positive multiple of Hkv \(k_cache.size\(1\) = 2\)"),
    "k head dim": (lambda a: a.update(k_cache=a["k_cache"][..., :32], v_cache=a["v_cache"][..., :32]),
                   r"k_cache head_dim must equal q's \(64\), got 32"),
    "v shape": (lambda a: a.update(v_cache=a["v_cache"][..., :32]), r"v_cache must have the shape of k_cache"),
    "q last dim": (lambda a: a.update(q=a["q"].transpose(0, 2).contiguous().transpose(0, 2)),
                   r"q must have a contiguous last dim \(stride 1\)"),
    "k last dim": (lambda a: a.update(k_cache=a["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)),
                   r"k_cache must have a contiguous last dim"),
}


# The keyword options, each bad in one way: (options, message).
BAD_OPTIONS = {
    "k_scale numel": (lambda q: dict(k_scale=torch.ones(2)),
                      r"k_scale must be a one-element float32 tensor on q's device \((cpu|meta)\), "
                      r"got 2 elements of Float on (cpu|meta)"),
    "v_scale dtype": (lambda q: dict(v_scale=torch.ones(1, dtype=torch.float64)),
                      r"v_scale must be a one-element float32 tensor on q's device \((cpu|meta)\), "
                      r"got 1 elements of Double on (cpu|meta)"),
    "logit_cap": (lambda q: dict(logit_cap=-1.0),
                  r"logit_cap must be >= 0 \(0 = off\) and finite, got -1.000000"),
    "logit_cap inf": (lambda q: dict(logit_cap=float("inf")), r"logit_cap must be >= 0"),
    "window": (lambda q: dict(sliding_window=-3),
               r"sliding_window must be -1 \(off\) or >= 0, got -3"),
    "sinks shape": (lambda q: dict(sinks=torch.zeros(3)),
                    r"sinks must have shape \[Hq\] = \[8\], got \[3\]"),
    "sinks dtype": (lambda q: dict(sinks=torch.zeros(8, dtype=torch.bfloat16)),
                    r"sinks must have dtype float32, got BFloat16"),
    "lse shape": (lambda q: dict(lse=torch.zeros(q.shape[0], 3)),
                  r"lse must have shape \[bs\*D, Hq\] = \[8, 8\], got \[8, 3\]"),
    "lse dtype": (lambda q: dict(lse=torch.zeros(q.shape[:2], dtype=torch.float16)),
                  r"lse must have dtype float32, got Half"),
    "lse overlap": (lambda q: dict(lse=torch.zeros(1, 8).expand(8, 8)),
                    r"lse must not overlap itself \(stride 0 on a dim of size > 1\)"),
}


def call(args, out=None, on_meta=False, options=None):
    options = dict(options or {})
    if on_meta:
        args = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        out = out.to("meta") if out is not None else None
        # empty_strided keeps an expanded lse expanded (to() would copy it).
        options = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                   if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    if out is None:
        return torch.ops.verify.tree_attn(*args.values(), **options)
    return torch.ops.verify.tree_attn_out(*args.values(), out, **options)


@pytest.mark.parametrize("on_meta", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("variant", ["functional", "out"])
@pytest.mark.parametrize("name", list(BAD))
def test_bad_argument(name, variant, on_meta):
    args = base_args()
    mutate, message = BAD[name]
    mutate(args)
    out = torch.empty(args["q"].shape, dtype=args["q"].dtype) if variant == "out" else None
    if out is not None and args["q"].dtype not in (torch.bfloat16, torch.float16, torch.float32):
        out = out.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=message):
        call(args, out, on_meta)


@pytest.mark.parametrize("name", [n for n in BAD if n != "q dtype"])
def test_fake_and_cpp_messages_match(name):
    messages = []
    for on_meta in (False, True):
        args = base_args()
        BAD[name][0](args)
        with pytest.raises(RuntimeError) as info:
            call(args, on_meta=on_meta)
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1]


@pytest.mark.parametrize("on_meta", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_bad_option(name, on_meta):
    args = base_args()
    make_options, message = BAD_OPTIONS[name]
    options = make_options(args["q"])
    # lse is an option of the out variant only.
    out = torch.empty_like(args["q"]) if "lse" in options else None
    with pytest.raises(RuntimeError, match=message):
        call(args, out, on_meta, options)


@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_fake_and_cpp_option_messages_match(name):
    messages = []
    for on_meta in (False, True):
        args = base_args()
        options = BAD_OPTIONS[name][0](args["q"])
        out = torch.empty_like(args["q"]) if "lse" in options else None
        with pytest.raises(RuntimeError) as info:
            call(args, out, on_meta, options)
        messages.append(str(info.value).splitlines()[0])
    # The meta device names itself where the CPU says cpu.
    assert messages[0] == messages[1].replace("meta", "cpu")


@pytest.mark.parametrize("on_meta", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("mutate,message", [
    (lambda o: o[:-1], r"out must have the shape of q"),
    (lambda o: o.half(), r"out must have the dtype of q \(BFloat16\), got Half"),
    (lambda o: o.transpose(0, 2).contiguous().transpose(0, 2), r"out must have a contiguous last dim"),
])
def test_bad_out(mutate, message, on_meta):
    args = base_args()
    out = mutate(torch.empty_like(args["q"]))
    with pytest.raises(RuntimeError, match=message):
        call(args, out, on_meta)


@pytest.mark.parametrize("on_meta", [False, True], ids=["cpu", "fake"])
def test_out_that_overlaps_itself(on_meta):
    args = base_args()
    row = torch.empty_like(args["q"][:1], device="meta" if on_meta else "cpu")
    with pytest.raises(RuntimeError, match=r"out must not overlap itself \(stride 0 on a dim of "
                                           r"size > 1\), got strides \[0, 64, 1\] for shape "
                                           r"\[8, 8, 64\]"):
        call(args, row.expand(args["q"].shape), on_meta)


def test_valid_args_pass_both_checks():
    args = base_args()
    assert call(args, on_meta=True).shape == args["q"].shape
    assert call(args).shape == args["q"].shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for a cross-device call")
def test_device_mismatch():
    args = base_args()
    args["k_cache"] = args["k_cache"].cuda()
    with pytest.raises(RuntimeError, match=r"k_cache must be on the same device as q"):
        call(args)


VALUE_ERRORS = {
    "slot": (lambda a: a["req_to_token"].__setitem__((a["req_pool_indices"][0], 2), 10**6),
             r"KV slots in req_to_token must lie in \[0, "),
    "request row": (lambda a: a["req_pool_indices"].__setitem__(1, 99),
                    r"req_pool_indices must lie in \[0, 5\)"),
    "seq_lens + D": (lambda a: a["seq_lens"].__setitem__(0, a["req_to_token"].shape[1]),
                     r"seq_lens \+ D must be <= max_ctx"),
    "negative len": (lambda a: a["seq_lens"].__setitem__(1, -1), r"seq_lens must be >= 0"),
}


# On CPU they always run (no device to sync with); VERIFY_OPS_DEBUG=1 changes nothing.
@pytest.mark.parametrize("name", list(VALUE_ERRORS))
def test_value_checks_on_cpu(name, debug):
    args = base_args()
    assert verify_ops.tree_attn(*args.values()).shape == args["q"].shape
    mutate, message = VALUE_ERRORS[name]
    mutate(args)
    with pytest.raises(RuntimeError, match=message):
        call(args)
