"""verify.tree_attn_out under CUDA-graph capture: one capture, many replays with new inputs."""

import pytest
import torch

import verify_ops
from verify_ops.cases import make_case
from verify_ops.reference import relative_error, tree_attn_ref

TOL = 1e-2
MAX_LEN = 65536


def refill(case, gen):
    """New cache contents, in place, so captured pointers stay valid."""
    case.k_cache.copy_(torch.randn(case.k_cache.shape, generator=gen).to(case.k_cache))
    case.v_cache.copy_(torch.randn(case.v_cache.shape, generator=gen).to(case.v_cache))


def capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside capture: cudaFuncSetAttribute, allocator pools
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def test_replay_with_changing_inputs():
    case = make_case([MAX_LEN, 300], 16, 8, 2, 128, device="cuda", tree="eagle", seed=1)
    out = torch.empty_like(case.q)
    graph = capture(lambda: verify_ops.tree_attn_out(*case.args(), out))
    gen = torch.Generator().manual_seed(2)
    rows = case.req_pool_indices.clone()
    lens_schedule = [(0, 0), (1, MAX_LEN), (MAX_LEN, 1), (4096, 17), (MAX_LEN - 5, 64000),
                     (12345, 0)]
    for step, lens in enumerate(lens_schedule):
        case.seq_lens.copy_(torch.tensor(lens, dtype=case.seq_lens.dtype))
        case.req_pool_indices.copy_(rows.flip(0) if step % 2 else rows)
        new_masks = torch.stack([
            verify_ops.trees.parents_to_mask(verify_ops.trees.random_tree(16, gen))
            for _ in range(2)])
        case.tree_mask.copy_(new_masks)
        case.q.copy_(torch.randn(case.q.shape, generator=gen).to(case.q))
        if step % 3 == 0:
            refill(case, gen)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = relative_error(out, tree_attn_ref(*case.args()))
        assert err < TOL, f"replay {step} with seq_lens {lens}: relative error {err:.3g}"


def test_replay_with_splits_merged_in_a_cluster():
    """Eight requests on eight KV heads: on a 132-SM H200, four splits per
    (request, KV head) merge inside their cluster; each replay's lengths give
    each request another number of active splits (one: no merge)."""
    case = make_case([8192] * 8, 8, 32, 8, 128, device="cuda", tree="random", seed=11)
    out = torch.empty_like(case.q)
    graph = capture(lambda: verify_ops.tree_attn_out(*case.args(), out))
    gen = torch.Generator().manual_seed(12)
    for step in range(4):
        lens = torch.randint(0, 8193, (8,), generator=gen)
        lens[step] = step  # a request with 0-3 prefix tokens in every replay
        case.seq_lens.copy_(lens.to(case.seq_lens))
        case.q.copy_(torch.randn(case.q.shape, generator=gen).to(case.q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = relative_error(out, tree_attn_ref(*case.args()))
        assert err < TOL, f"replay {step} with seq_lens {lens.tolist()}: relative error {err:.3g}"


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["bf16", "e4m3", "e5m2"])
def test_replay_with_changing_options(kv_dtype):
    """One capture with every option: each replay gets new scales, sinks,
    lengths and trees in the captured tensors (a window is a Python int, so a
    new window is a new capture: two here), and out and lse match."""
    gen = torch.Generator().manual_seed(21)
    for window in (128, 3):
        case = make_case([20000, 130, 0], 8, 8, 1, 64, device="cuda", tree="eagle",
                         kv_dtype=kv_dtype, kv_scales=True, sinks=True, logit_cap=30.0,
                         sliding_window=window, seed=22)
        out = torch.empty_like(case.q)
        lse = torch.empty(case.q.shape[:2], device="cuda")
        graph = capture(lambda: verify_ops.tree_attn_out(*case.args(), out, lse=lse,
                                                         **case.options))
        for step in range(4):
            lens = torch.tensor([20000 - 997 * step, 130 - 40 * step, 0])
            case.seq_lens.copy_(lens.to(case.seq_lens))
            case.options["k_scale"].copy_(0.5 + torch.rand(1, generator=gen))
            case.options["v_scale"].copy_(0.5 + torch.rand(1, generator=gen))
            case.options["sinks"].copy_(2 * torch.randn(8, generator=gen))
            case.q.copy_(torch.randn(case.q.shape, generator=gen).to(case.q))
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref, ref_lse = tree_attn_ref(*case.args(), **case.options, return_lse=True)
            err = relative_error(out, ref)
            assert err < TOL, f"window {window}, replay {step}: relative error {err:.3g}"
            assert torch.allclose(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


def test_memory_flat_over_replays():
    case = make_case([5000, 20, 0], 8, 32, 8, 128, device="cuda", seed=3)
    out = torch.empty_like(case.q)
    graph = capture(lambda: verify_ops.tree_attn_out(*case.args(), out))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(100):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    assert relative_error(out, tree_attn_ref(*case.args())) < TOL


def test_two_streams_concurrently():
    cases = [make_case([30000, 7], 8, 16, 2, 128, device="cuda", seed=s) for s in (4, 5)]
    outs = [torch.full_like(c.q, float("nan")) for c in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    torch.cuda.synchronize()
    for _ in range(5):
        for case, out, stream in zip(cases, outs, streams):
            with torch.cuda.stream(stream):
                verify_ops.tree_attn_out(*case.args(), out)
    torch.cuda.synchronize()
    for case, out in zip(cases, outs):
        assert relative_error(out, tree_attn_ref(*case.args())) < TOL


class VerifyLayer(torch.nn.Module):
    def __init__(self, hq, head_dim):
        super().__init__()
        self.proj = torch.nn.Linear(hq * head_dim, hq * head_dim, bias=False,
                                    dtype=torch.bfloat16, device="cuda")
        self.hq, self.head_dim = hq, head_dim

    def forward(self, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, tree_mask):
        q = q * 1.0  # a producer op inside the graph, as a QKV projection would be
        out = torch.empty_like(q)
        torch.ops.verify.tree_attn_out(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                       seq_lens, tree_mask, self.head_dim ** -0.5, out)
        return self.proj(out.view(-1, self.hq * self.head_dim))


def test_compile_reduce_overhead_records_cuda_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    case = make_case([2000, 3, 900], 8, 8, 2, 128, device="cuda", seed=6)
    layer = VerifyLayer(8, 128)
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    args = case.args()[:-1]
    for step in range(4):
        # Shrink only: positions past a request's owned slots hold NaN by design.
        case.seq_lens.copy_(torch.tensor([2000 - step * 100, 3 - step % 3, 900 - 7 * step],
                                         device="cuda"))
        result = compiled(*args).clone()
        expected = layer.proj(tree_attn_ref(*case.args()).to(torch.bfloat16).view(-1, 8 * 128))
        assert relative_error(result, expected) < TOL
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
