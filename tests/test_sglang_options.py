"""The backend serves every option the op has, on real SGLang pools, on CPU.

fp8 KV pools (MHATokenToKVPool in float8_e4m3fn / float8_e5m2, with and
without the layer's scales), logit soft-caps, attention sinks passed per call,
sliding windows on a plain pool and on SGLang's hybrid SWA pool, and paged
pools (page sizes 16 and 64) with chains and trees: each TARGET_VERIFY output
against the float64 reference, eagerly and through the CUDA-graph metadata
path, and against SGLang's own Triton verify where Triton serves the option
(sinks, soft-cap, paged pools; windows with chains only, since Triton places
tree drafts by their flattened index). Not fp8: SGLang marks its Triton
backend unsupported for fp8 KV, and its interpreted verify here differs from
the reference by 2-6 % on fp8 pools, where the op agrees to < 2e-3. Also the served counter and the
``VERIFY_OPS_LOG_VERIFY`` lines. Triton runs interpreted, in a child process.
"""

import pytest

for _module in ("sglang.srt.configs.model_config", "sglang.srt.model_executor.forward_batch_info"):
    pytest.importorskip(_module)

import torch  # noqa: E402

from tests.support.interpreter import in_child, interpreter_child_test  # noqa: E402

TOL = 2e-3  # fp16 outputs; every kernel accumulates in fp32

test_option_tests_in_triton_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture()
def sg():
    from tests.support import sglang_objects  # defines SGLang's Triton kernels: only after TRITON_INTERPRET

    return sglang_objects


@pytest.fixture(autouse=True)
def fresh_stats():
    from verify_ops.sglang import stats

    stats.reset()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _err(out, ref, shape):
    from verify_ops import relative_error

    return relative_error(out.reshape(ref.shape[0], -1, shape.head_dim).float(), ref)


CHAIN = dict(topk=1, steps=3, num_drafts=4)
# name: (Shape fields, RadixAttention kwargs, KV scales, sinks, compare with Triton)
CASES = {
    "fp8_e4m3 scaled": (dict(kv_dtype=torch.float8_e4m3fn), {}, (0.5, 2.0), False, False),
    "fp8_e5m2": (dict(kv_dtype=torch.float8_e5m2), {}, None, False, False),
    "soft-cap (Grok)": ({}, dict(logit_cap=3.0), None, False, True),
    "sinks": ({}, {}, None, True, True),
    "window, tree": (dict(window=16), dict(sliding_window_size=16), None, False, False),
    "window, chain": (dict(window=16, **CHAIN), dict(sliding_window_size=16), None, False, True),
    "gpt-oss: window + sinks, head_dim 64": (
        dict(window=16, head_dim=64, num_q_heads=8, num_kv_heads=1),
        dict(sliding_window_size=16), None, True, False),
    "fp8 + window": (dict(kv_dtype=torch.float8_e4m3fn, window=8),
                     dict(sliding_window_size=8), (1.5, 0.75), False, False),
    "paged 16, tree": (dict(page_size=16, pool_slots=1024), {}, None, False, True),
    "paged 64, tree": (dict(page_size=64, pool_slots=2048), {}, None, False, True),
    "paged 16, chain": (dict(page_size=16, pool_slots=1024, **CHAIN), {}, None, False, True),
    "paged 64, chain, fp8 + soft-cap": (
        dict(page_size=64, pool_slots=2048, kv_dtype=torch.float8_e4m3fn, **CHAIN),
        dict(logit_cap=3.0), (0.5, 0.5), False, False),
}


@in_child
@pytest.mark.parametrize("case", list(CASES))
def test_option_served_like_reference_and_triton(sg, case):
    from verify_ops.sglang import stats

    shape_fields, layer_kwargs, scales, with_sinks, against_triton = CASES[case]
    shape = sg.Shape(**shape_fields)
    with sg.sglang_config(shape):
        triton, ops, runner = sg.build_backends(shape)
        assert ops.serves_verify, "the option must not turn the op off"
        layer = sg.attention_layer(shape, **layer_kwargs)
        if scales is not None:
            sg.set_kv_scales(layer, *scales)
        batch, tree = sg.place_batch(shape, runner, _gen(0)), sg.draft_tree(shape, _gen(1))
        q, k, v = sg.random_qkv(shape, _gen(2))
        sinks = (torch.randn(shape.num_q_heads, generator=_gen(3)) + 2).to(torch.bfloat16) \
            if with_sinks else None  # bf16, as gpt-oss keeps them
        out_ops, mask, _ = sg.run_verify(shape, ops, runner, batch, tree, q.clone(), k.clone(),
                                         v.clone(), layer, sinks=sinks)
        tree_mask = mask[: shape.bs * shape.num_drafts ** 2].view(shape.bs, shape.num_drafts, -1)
        ref = sg.reference(shape, runner, batch, q, tree_mask, layer=layer, sinks=sinks)
        plain = sg.reference(shape, runner, batch, q, tree_mask)
        if against_triton:
            out_triton, _, _ = sg.run_verify(shape, triton, runner, batch, tree, q.clone(),
                                             k.clone(), v.clone(), layer, sinks=sinks)
    assert stats.snapshot() == {"served": 1, "fallbacks": {}}
    assert _err(out_ops, ref, shape) < TOL
    if layer_kwargs or with_sinks or scales:
        assert _err(plain, ref, shape) > 0.02, "the option must change the output"
    if against_triton:
        assert _err(out_triton, ref, shape) < TOL
        assert _err(out_ops, out_triton.reshape(ref.shape).double(), shape) < TOL


@in_child
@pytest.mark.parametrize("case", ["sinks", "gpt-oss: window + sinks, head_dim 64",
                                  "fp8 + window", "paged 64, tree"])
def test_option_served_through_cuda_graph_metadata(sg, case):
    """The graph runner's path: capture metadata, then per replay the static inputs,
    ``init_forward_metadata_out_graph`` and the captured ``init_forward_metadata_in_graph``
    plus forward; sinks arrive per call, the window tables are rebuilt in-graph."""
    from verify_ops.sglang import stats

    shape_fields, layer_kwargs, scales, with_sinks, _ = CASES[case]
    shape = sg.Shape(**{"req_rows": 12, **shape_fields})  # rows for both replays
    with sg.sglang_config(shape):
        _, ops, runner = sg.build_backends(shape)
        layer = sg.attention_layer(shape, **layer_kwargs)
        if scales is not None:
            sg.set_kv_scales(layer, *scales)
        ops.init_cuda_graph_state(shape.bs, shape.bs * shape.num_drafts)
        inputs = sg.graph_inputs(shape, shape.bs, ops.get_cuda_graph_seq_len_fill_value())
        captured = sg.capture_batch(shape, runner, inputs)
        ops.init_forward_metadata_out_graph(captured, in_capture=True)
        sinks = torch.randn(shape.num_q_heads, generator=_gen(3)) + 2 if with_sinks else None
        for seed in (10, 20):  # two replays, new batches
            batch, tree = sg.place_batch(shape, runner, _gen(seed)), sg.draft_tree(
                shape, _gen(seed + 1))
            q, k, v = sg.random_qkv(shape, _gen(seed + 2))
            mask = sg.write_tree_mask(shape, tree, batch.seq_lens, ops)
            fb = sg.forward_batch(shape, runner, batch,
                                  sg.verify_input(shape, tree, mask, batch.seq_lens))
            ops.init_forward_metadata_out_graph(sg.stage_replay(shape, inputs, fb))
            sg.poison_draft_slots(runner, batch, [layer])
            ops.init_forward_metadata_in_graph(captured)
            out = ops.forward(q, k, v, layer, captured, sinks=sinks)
            tree_mask = ops.tree_mask
            ref = sg.reference(shape, runner, batch, q, tree_mask, layer=layer, sinks=sinks)
            assert _err(out, ref, shape) < TOL
    assert stats.snapshot() == {"served": 2, "fallbacks": {}}


def _swa_shape(sg, **fields):
    # Layer 0 full attention, layer 1 a window layer in the SWA sub-pool; prefixes
    # longer and shorter than the window.
    return sg.Shape(prefix_lens=(37, 0, 1, 12, 9), layer_num=2, swa_layers=(1,), window=8,
                    req_rows=8, **fields)


@in_child
@pytest.mark.parametrize("tree", ["tree", "chain"])
def test_hybrid_swa_pool_served_through_translated_tables(sg, tree):
    from verify_ops.sglang import stats

    shape = _swa_shape(sg, **(CHAIN if tree == "chain" else {}))
    with sg.sglang_config(shape):
        triton, ops, runner = sg.build_backends(shape)
        assert ops.use_sliding_window_kv_pool and ops.serves_verify
        layers = [sg.attention_layer(shape, 0),
                  sg.attention_layer(shape, 1, sliding_window_size=shape.window)]
        batch, draft = sg.place_batch(shape, runner, _gen(0)), sg.draft_tree(shape, _gen(1))
        mapping = sg.full_to_swa(runner)
        assert not torch.equal(mapping[batch.out_cache_loc], batch.out_cache_loc), \
            "the SWA pool's slots must differ from the full pool's"
        outs, refs = {}, {}
        for layer in layers:
            q, k, v = sg.random_qkv(shape, _gen(2 + layer.layer_id))
            out, mask, _ = sg.run_verify(shape, ops, runner, batch, draft, q, k, v, layer)
            tree_mask = mask[: shape.bs * shape.num_drafts ** 2].view(shape.bs,
                                                                     shape.num_drafts, -1)
            refs[layer.layer_id] = sg.reference(shape, runner, batch, q, tree_mask, layer=layer)
            outs[layer.layer_id] = out
            if tree == "chain":
                out_triton, _, _ = sg.run_verify(shape, triton, runner, batch, draft, q, k, v,
                                                 layer)
                assert _err(out_triton, refs[layer.layer_id], shape) < TOL
    for layer_id, ref in refs.items():
        assert _err(outs[layer_id], ref, shape) < TOL
    assert stats.snapshot()["served"] == 2


@in_child
def test_served_batches_counted_and_logged_once_per_batch(sg, monkeypatch, caplog):
    from verify_ops.sglang import stats

    monkeypatch.setenv("VERIFY_OPS_LOG_VERIFY", "1")
    shape = sg.Shape()
    with sg.sglang_config(shape), caplog.at_level("INFO", logger="verify_ops.sglang.stats"):
        _, ops, runner = sg.build_backends(shape)
        layers = [sg.attention_layer(shape, 0)]
        batch, tree = sg.place_batch(shape, runner, _gen(0)), sg.draft_tree(shape, _gen(1))
        q, k, v = sg.random_qkv(shape, _gen(2))
        for _ in range(2):  # two batches of three layer calls each
            _, _, fb = sg.run_verify(shape, ops, runner, batch, tree, q, k, v, layers[0])
            for _ in range(2):
                fb._attn_output = None
                ops.forward(q, k, v, layers[0], fb)
    lines = [r.getMessage() for r in caplog.records if r.name == "verify_ops.sglang.stats"]
    assert lines == [f"verify_ops: TARGET_VERIFY served by tree_attn (bs={shape.bs}, "
                     f"D={shape.num_drafts})"] * 2
    assert stats.snapshot() == {"served": 2, "fallbacks": {}}
