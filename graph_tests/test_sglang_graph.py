"""VerifyOpsAttnBackend on CUDA over real SGLang pools and EAGLE (topk > 1) batches.

Eager: the TARGET_VERIFY forward against the float64 reference and against
SGLang's own TritonAttnBackend (extend_attention_fwd over the FULL_MASK SGLang
builds for it). CUDA graphs: each backend driven as SGLang 0.5.23's decode
graph runner drives it (``init_cuda_graph_state``; ``init_forward_metadata_out_graph``
with ``in_capture=True``; warm-ups and capture of ``init_forward_metadata_in_graph``
plus the forward; then per batch: inputs copied into the static buffers,
``init_forward_metadata_out_graph`` on the replay view, replay), with new
lengths (0 and 1 among them), rows, slots, trees and q/k/v at every replay.
The options (fp8 KV with scales, soft-cap, sinks, windows on a plain and on a
hybrid SWA pool, paged pools) through captured graphs, against the reference.
"""

from __future__ import annotations

import dataclasses

import pytest

# sglang itself may import while its deeper modules lack dependencies; skip on
# what the tests really import.
for _module in ("sglang.srt.configs.model_config", "sglang.srt.model_executor.forward_batch_info",
                "sglang.srt.layers.attention.triton_backend",
                "sglang.srt.model_executor.runner.decode_cuda_graph_runner"):
    pytest.importorskip(_module)

import torch  # noqa: E402

from verify_ops import relative_error  # noqa: E402
from verify_ops.trees import full_mask_to_qlen_only  # noqa: E402

TOL = 1e-2  # bf16 outputs; every kernel accumulates in fp32
DEVICE, DTYPE = "cuda", torch.bfloat16
HEADS = {"32-8-128": (32, 8, 128), "8-1-128": (8, 1, 128)}  # Llama-3-8B; a TP8 MoE rank
# (topk, steps, num_draft_tokens) as passed to SGLang's EAGLE.
TREES = {"D8": (4, 3, 8), "D64": (8, 5, 64)}
EAGER_PREFIX_LENS = (2999, 0, 1, 4100, 37)
GRAPH_MAX_BS = 5
# One captured graph, then these batches: raw batches smaller than the graph are
# padded as SGLang pads them.
REPLAY_PREFIX_LENS = [(4100, 0, 1, 2999, 37), (0, 1), (1, 7000, 0, 12), (2048,) * 5, (1,)]


@pytest.fixture(scope="module")
def sg():
    from tests.support import sglang_objects  # compiled Triton here: not interpreted

    return sglang_objects


def _shape(sg, heads, tree, prefix_lens):
    num_q_heads, num_kv_heads, head_dim = heads
    topk, steps, num_drafts = tree
    # Pool and rows hold every batch a test places (each takes 2x its tokens).
    return sg.Shape(prefix_lens=prefix_lens, topk=topk, steps=steps, num_drafts=num_drafts,
                    num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                    context_len=8192, req_rows=48, pool_slots=100_000, dtype=DTYPE,
                    device=DEVICE)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _poison_draft_slots(runner, batch):
    # Each backend must store the drafts' K/V itself before attending to them.
    pool = runner.token_to_kv_pool
    for buffer in (pool.get_key_buffer(0), pool.get_value_buffer(0)):
        buffer[batch.out_cache_loc] = float("nan")


def _err(out, ref, shape):
    return relative_error(out.reshape(ref.shape[0], -1, shape.head_dim).float(), ref)


def _assert_drafts_stored(runner, batch, k, v):
    pool = runner.token_to_kv_pool
    assert torch.equal(pool.get_key_buffer(0)[batch.out_cache_loc], k)
    assert torch.equal(pool.get_value_buffer(0)[batch.out_cache_loc], v)


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_eager_verify_matches_reference_and_triton(sg, heads, tree):
    shape = _shape(sg, heads, tree, EAGER_PREFIX_LENS)
    with sg.sglang_config(shape):
        triton, ops, runner = sg.build_backends(shape)
        assert ops.serves_verify
        batch, draft = sg.place_batch(shape, runner, _gen(0)), sg.draft_tree(shape, _gen(1))
        q, k, v = sg.random_qkv(shape, _gen(2))
        layer = sg.attention_layer(shape)
        outs, masks = {}, {}
        for name, backend in (("triton", triton), ("verify_ops", ops)):
            masks[name] = sg.write_tree_mask(shape, draft, batch.seq_lens, backend)
            fb = sg.forward_batch(shape, runner, batch,
                                  sg.verify_input(shape, draft, masks[name], batch.seq_lens))
            _poison_draft_slots(runner, batch)
            fb._attn_output = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEVICE)
            backend.init_forward_metadata(fb)
            outs[name] = backend.forward(q, k, v, layer, fb)
            assert outs[name].data_ptr() == fb._attn_output.data_ptr()
            torch.cuda.synchronize()
            _assert_drafts_stored(runner, batch, k, v)

    assert masks["verify_ops"].data_ptr() == ops.verify_mask.buffer.data_ptr()
    tree_mask = sg.qlen_only_tree_mask(shape, draft, batch.seq_lens)
    # SGLang's two layouts of one tree agree, so both backends verify the same tree.
    assert torch.equal(full_mask_to_qlen_only(masks["triton"], batch.seq_lens, shape.num_drafts),
                       tree_mask)
    ref = sg.reference(shape, runner, batch, q, tree_mask)
    chain = torch.ones_like(tree_mask).tril()
    assert _err(ref, sg.reference(shape, runner, batch, q, chain), shape) > 0.05, \
        "the tree must matter"
    errors = {name: _err(out, ref, shape) for name, out in outs.items()}
    errors["verify_ops vs triton"] = _err(outs["verify_ops"],
                                          outs["triton"].reshape(ref.shape).double(), shape)
    assert all(err < TOL for err in errors.values()), errors


def _capture(run_once):
    """As SGLang's full-graph backend: two warm-ups on the capture stream, then the
    capture on it. Returns the graph and the output tensor it writes."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run_once()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = run_once()
    return graph, out


@dataclasses.dataclass
class CapturedVerify:
    backend: object
    inputs: object  # tests.support.sglang_objects.GraphInputs
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor


def _capture_verify(sg, shape, runner, backend, layer, static_qkv) -> CapturedVerify:
    backend.init_cuda_graph_state(GRAPH_MAX_BS, GRAPH_MAX_BS * shape.num_drafts)
    inputs = sg.graph_inputs(shape, GRAPH_MAX_BS, backend.get_cuda_graph_seq_len_fill_value())
    fb = sg.capture_batch(shape, runner, inputs)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)

    def run_once():
        backend.init_forward_metadata_in_graph(fb)
        return backend.forward(*static_qkv, layer, fb)

    return CapturedVerify(backend, inputs, *_capture(run_once))


@pytest.mark.parametrize("heads, tree", [(HEADS["32-8-128"], TREES["D8"]),
                                         (HEADS["8-1-128"], TREES["D64"])],
                         ids=["32-8-128-D8", "8-1-128-D64"])
def test_graph_replays_match_reference(sg, heads, tree):
    shape = _shape(sg, heads, tree, (0,) * GRAPH_MAX_BS)  # the captured width
    with sg.sglang_config(shape):
        triton, ops, runner = sg.build_backends(shape)
        assert ops.serves_verify
        layer = sg.attention_layer(shape)
        static_qkv = sg.random_qkv(shape, _gen(3))  # views into one fused QKV, as models pass
        captured = {"verify_ops": _capture_verify(sg, shape, runner, ops, layer, static_qkv),
                    "triton": _capture_verify(sg, shape, runner, triton, layer, static_qkv)}
        ops_mask_address = ops.tree_mask.data_ptr()
        assert ops_mask_address == ops.verify_mask.buffer.data_ptr()

        for step, prefix_lens in enumerate(REPLAY_PREFIX_LENS):
            batch_shape = dataclasses.replace(shape, prefix_lens=prefix_lens)
            gen = _gen(10 + step)
            batch, draft = sg.place_batch(batch_shape, runner, gen), sg.draft_tree(batch_shape, gen)
            q, k, v = sg.random_qkv(batch_shape, gen)
            for static, new in zip(static_qkv, (q, k, v)):
                sg.fill_random(static, gen)  # padded rows: junk, not zeros
                static[: new.shape[0]].copy_(new)  # copy: the graph reads these addresses
            tree_mask = sg.qlen_only_tree_mask(batch_shape, draft, batch.seq_lens)
            rows = batch_shape.bs * shape.num_drafts
            ref, outs = None, {}
            for name, c in captured.items():
                mask = sg.write_tree_mask(batch_shape, draft, batch.seq_lens, c.backend)
                assert mask.data_ptr() == c.backend.verify_mask.buffer.data_ptr()
                fb = sg.forward_batch(batch_shape, runner, batch,
                                      sg.verify_input(batch_shape, draft, mask, batch.seq_lens))
                c.backend.init_forward_metadata_out_graph(sg.stage_replay(shape, c.inputs, fb))
                _poison_draft_slots(runner, batch)
                c.out.fill_(float("nan"))
                c.graph.replay()
                torch.cuda.synchronize()
                _assert_drafts_stored(runner, batch, k, v)
                if ref is None:  # the pool now holds the drafts' K/V
                    ref = sg.reference(batch_shape, runner, batch, q, tree_mask)
                outs[name] = c.out[:rows].clone()
                err = _err(outs[name], ref, shape)
                assert err < TOL, (f"{name} replay {step}, prefix lens {prefix_lens}: "
                                   f"relative error {err:.3g}")
            assert ops.tree_mask.data_ptr() == ops_mask_address, "replays must copy, not rebind"
            err = _err(outs["verify_ops"], outs["triton"].reshape(ref.shape).double(), shape)
            assert err < TOL, f"verify_ops vs triton, replay {step}: relative error {err:.3g}"


# name: (heads, tree, Shape fields, RadixAttention kwargs, KV scales per replay, sinks)
OPTION_CASES = {
    "gpt-oss: window 128 + sinks": ((64, 8, 64), TREES["D8"], dict(window=128),
                                    dict(sliding_window_size=128), None, True),
    "fp8 e4m3 + soft-cap 30, scales change": (
        HEADS["32-8-128"], TREES["D8"], dict(kv_dtype=torch.float8_e4m3fn),
        dict(logit_cap=30.0), [(0.5, 2.0), (1.25, 0.75)], False),
    "hybrid SWA pool, window 128": (HEADS["8-1-128"], TREES["D8"],
                                    dict(layer_num=2, swa_layers=(1,), window=128),
                                    dict(layer_id=1, sliding_window_size=128), None, False),
    "paged 64, tree": (HEADS["32-8-128"], TREES["D8"], dict(page_size=64), {}, None, False),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_graph_replays_serve_options(sg, case):
    """The options in one captured graph: new KV scales (written into the layer's
    scale tensors), new sinks values, and window tables rebuilt in the graph at
    every replay, against the float64 reference; every replay counted as served."""
    from verify_ops.sglang import stats

    heads, tree, fields, layer_kwargs, scales, with_sinks = OPTION_CASES[case]
    shape = dataclasses.replace(_shape(sg, heads, tree, (0,) * GRAPH_MAX_BS), **fields)
    stats.reset()
    with sg.sglang_config(shape):
        _, ops, runner = sg.build_backends(shape)
        assert ops.serves_verify
        layer = sg.attention_layer(shape, **layer_kwargs)
        if scales:
            sg.set_kv_scales(layer, *scales[0])
            layer.to(DEVICE)
        sinks = torch.zeros(shape.num_q_heads, dtype=torch.bfloat16, device=DEVICE)
        static_qkv = sg.random_qkv(shape, _gen(3))

        ops.init_cuda_graph_state(GRAPH_MAX_BS, GRAPH_MAX_BS * shape.num_drafts)
        inputs = sg.graph_inputs(shape, GRAPH_MAX_BS, ops.get_cuda_graph_seq_len_fill_value())
        fb = sg.capture_batch(shape, runner, inputs)
        ops.init_forward_metadata_out_graph(fb, in_capture=True)

        def run_once():
            ops.init_forward_metadata_in_graph(fb)
            return ops.forward(*static_qkv, layer, fb, sinks=sinks if with_sinks else None)

        graph, out = _capture(run_once)
        for step, prefix_lens in enumerate(REPLAY_PREFIX_LENS):
            batch_shape = dataclasses.replace(shape, prefix_lens=prefix_lens)
            gen = _gen(20 + step)
            if scales:
                layer.k_scale.fill_(scales[step % 2][0])
                layer.v_scale.fill_(scales[step % 2][1])
            sinks.copy_(torch.randn(shape.num_q_heads, generator=gen) + 2)
            batch, draft = sg.place_batch(batch_shape, runner, gen), sg.draft_tree(batch_shape, gen)
            q, k, v = sg.random_qkv(batch_shape, gen)
            for static, new in zip(static_qkv, (q, k, v)):
                sg.fill_random(static, gen)
                static[: new.shape[0]].copy_(new)
            mask = sg.write_tree_mask(batch_shape, draft, batch.seq_lens, ops)
            view = sg.forward_batch(batch_shape, runner, batch,
                                    sg.verify_input(batch_shape, draft, mask, batch.seq_lens))
            ops.init_forward_metadata_out_graph(sg.stage_replay(shape, inputs, view))
            sg.poison_draft_slots(runner, batch, [layer])
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            tree_mask = sg.qlen_only_tree_mask(batch_shape, draft, batch.seq_lens)
            ref = sg.reference(batch_shape, runner, batch, q, tree_mask, layer=layer,
                               sinks=sinks if with_sinks else None)
            rows = batch_shape.bs * shape.num_drafts
            err = _err(out[:rows], ref, shape)
            assert err < TOL, f"{case}, replay {step}, prefix lens {prefix_lens}: {err:.3g}"
    assert stats.snapshot() == {"served": len(REPLAY_PREFIX_LENS), "fallbacks": {}}
