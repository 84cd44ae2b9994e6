"""The verify_ops SGLang backend against SGLang's own TritonAttnBackend, on CPU.

Both run on real SGLang pools with an EAGLE topk > 1 TARGET_VERIFY batch;
Triton's kernels run under ``TRITON_INTERPRET=1`` (fp16: the interpreter gets
bf16 wrong), in a child process (tests/support/interpreter.py).
"""

from types import SimpleNamespace

import pytest

# sglang itself may import while its deeper modules lack dependencies (seen on
# the H200 box: no `dill`); skip on what the tests really import.
for _module in ("sglang.srt.configs.model_config", "sglang.srt.model_executor.forward_batch_info"):
    pytest.importorskip(_module)

import torch  # noqa: E402

from tests.support.interpreter import in_child, interpreter_child_test  # noqa: E402

TOL = 2e-3  # fp16 outputs; both kernels accumulate in fp32

test_backend_tests_in_triton_interpreter_child = interpreter_child_test(__file__)


@pytest.fixture()
def sg():
    from tests.support import sglang_objects  # defines SGLang's Triton kernels: only after TRITON_INTERPRET

    return sglang_objects


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _run_verify(sg, shape, backend, runner, batch, tree, q, k, v, layer, **kwargs):
    return sg.run_verify(shape, backend, runner, batch, tree, q, k, v, layer, **kwargs)


def _poison_draft_slots(runner, batch):
    from tests.support.sglang_objects import poison_draft_slots

    poison_draft_slots(runner, batch, [SimpleNamespace(layer_id=0)])


def _reference(shape, runner, batch, q, tree_mask):
    from verify_ops import tree_attn_ref

    pool = runner.token_to_kv_pool
    return tree_attn_ref(q.reshape(-1, shape.num_q_heads, shape.head_dim),
                         pool.get_key_buffer(0), pool.get_value_buffer(0),
                         runner.req_to_token_pool.req_to_token, batch.req_pool_indices,
                         batch.seq_lens, tree_mask, shape.head_dim ** -0.5)


def _err(out, ref, shape):
    from verify_ops import relative_error

    return relative_error(out.reshape(ref.shape[0], -1, shape.head_dim).float(), ref)


@in_child
def test_verify_matches_triton_and_reference(sg):
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    from verify_ops.trees import full_mask_to_qlen_only

    shape = sg.Shape()
    with sg.sglang_config(shape):
        triton, ops, runner = sg.build_backends(shape)
        assert triton.verify_mask is None and ops.verify_mask.mode == TreeMaskMode.QLEN_ONLY
        batch, tree = sg.place_batch(shape, runner, _gen(0)), sg.draft_tree(shape, _gen(1))
        q, k, v = sg.random_qkv(shape, _gen(2))
        layer = sg.attention_layer(shape)
        args = (runner, batch, tree, q, k, v, layer)
        out_triton, full_mask, _ = _run_verify(sg, shape, triton, *args)
        out_ops, qlen_flat, _ = _run_verify(sg, shape, ops, *args)
        # SGLang's warmup batches carry the graph runner's oversized all-ones mask.
        warmup_mask = torch.ones((shape.bs + 2 * q.shape[0]) * shape.num_drafts, dtype=torch.bool)
        warmup = sg.forward_batch(
            shape, runner, batch, sg.verify_input(shape, tree, warmup_mask, batch.seq_lens))
        ops.init_forward_metadata(warmup)
        out_warmup = ops.forward(q, k, v, layer, warmup)

    assert qlen_flat.data_ptr() == ops.verify_mask.buffer.data_ptr()  # drafter wrote in place
    tree_mask = qlen_flat[: shape.bs * shape.num_drafts ** 2].view(shape.bs, shape.num_drafts, -1)
    as_qlen = full_mask_to_qlen_only(full_mask, batch.seq_lens, shape.num_drafts)
    assert torch.equal(as_qlen, tree_mask)  # SGLang's two layouts of one tree agree
    assert not all(torch.equal(tree_mask[0], m) for m in tree_mask[1:]), "trees should differ"
    pool = runner.token_to_kv_pool
    assert torch.equal(pool.get_key_buffer(0)[batch.out_cache_loc], k)
    assert torch.equal(pool.get_value_buffer(0)[batch.out_cache_loc], v)

    ref = _reference(shape, runner, batch, q, tree_mask)
    chain = torch.ones_like(tree_mask).tril()
    assert _err(ref, _reference(shape, runner, batch, q, chain), shape) > 0.05, "tree must matter"
    assert _err(out_triton, ref, shape) < TOL
    assert _err(out_ops, ref, shape) < TOL
    assert _err(out_ops, out_triton.reshape(ref.shape).double(), shape) < TOL
    all_visible = torch.ones_like(tree_mask)
    assert _err(out_warmup, _reference(shape, runner, batch, q, all_visible), shape) < TOL


@in_child
def test_graph_metadata_copies_into_owned_buffers(sg):
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    from verify_ops.sglang.tree_mask import allocate_verify_mask

    shape = sg.Shape()
    graph_bs = shape.bs + 1  # one padded request, as a captured batch size bucket
    tokens = graph_bs * shape.num_drafts
    with sg.sglang_config(shape):
        _, ops, runner = sg.build_backends(shape)
        ops.init_cuda_graph_state(graph_bs, tokens)
        owned = ops.verify_mask.buffer
        assert ops.verify_mask.mode == TreeMaskMode.QLEN_ONLY
        assert owned.numel() == max(shape.req_rows, graph_bs) * shape.num_drafts ** 2

        # Capture: the graph runner's static buffers and its all-ones capture mask.
        seq_lens = torch.ones(graph_bs, dtype=torch.int64)
        rows = torch.zeros(graph_bs, dtype=torch.int64)
        locs = torch.zeros(tokens, dtype=torch.int64)
        qkv_static = [x.new_zeros((tokens,) + x.shape[1:]) for x in sg.random_qkv(shape, _gen(3))]
        capture_tree = sg.DraftTree(None, None, torch.zeros(tokens, dtype=torch.long),
                                    torch.zeros(3, graph_bs, shape.num_drafts, dtype=torch.long))
        capture_mask = torch.ones((graph_bs + tokens) * shape.num_drafts, dtype=torch.bool)
        static = sg.VerifyBatch(rows, seq_lens, locs)
        captured = sg.forward_batch(
            shape, runner, static, sg.verify_input(shape, capture_tree, capture_mask, seq_lens))
        ops.init_forward_metadata_out_graph(captured, in_capture=True)
        ops.init_forward_metadata_in_graph(captured)
        captured_tree_mask = ops.tree_mask  # what a captured graph keeps reading
        assert captured_tree_mask.data_ptr() == owned.data_ptr()
        layer = sg.attention_layer(shape)

        batch = sg.place_batch(shape, runner, _gen(4))
        for seed, drafter_owns_mask in ((5, True), (6, False)):
            # Replay: new values copied into the static buffers, metadata prepared
            # again outside the graph, then the captured forward re-executed.
            tree = sg.draft_tree(shape, _gen(seed))
            target = ops if drafter_owns_mask else SimpleNamespace(
                verify_mask=allocate_verify_mask(shape.bs, shape.num_drafts, "cpu"))
            mask = sg.write_tree_mask(shape, tree, batch.seq_lens, target)
            n = shape.bs
            seq_lens[:n], rows[:n] = batch.seq_lens, batch.req_pool_indices
            locs[: n * shape.num_drafts] = batch.out_cache_loc
            q, k, v = sg.random_qkv(shape, _gen(seed + 10))
            for static_x, x in zip(qkv_static, (q, k, v)):
                static_x.normal_(generator=_gen(seed + 20))  # padded rows: junk, not zeros
                static_x[: x.shape[0]] = x
            tree.positions = tree.positions.new_zeros(tokens)
            spec_info = sg.verify_input(shape, tree, mask, seq_lens)
            view = sg.forward_batch(shape, runner, static, spec_info)
            ops.init_forward_metadata_out_graph(view)
            assert ops.verify_mask.buffer is owned and ops.tree_mask.data_ptr() == owned.data_ptr()
            ops.tree_mask = captured_tree_mask  # replay runs on capture-time addresses
            _poison_draft_slots(runner, batch)
            out = ops.forward(*qkv_static, layer, captured)
            tree_mask = owned[: n * shape.num_drafts ** 2].view(n, shape.num_drafts, -1)
            assert torch.equal(tree_mask.flatten(), mask[: tree_mask.numel()])
            ref = _reference(shape, runner, batch, q, tree_mask)
            assert _err(out[: q.shape[0]], ref, shape) < TOL


@in_child
def test_verify_mask_bytes_at_long_context(sg, monkeypatch):
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.layers.attention.verify_mask import tree_mask_numel
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    made, make = [], triton_backend.maybe_create_verify_mask
    monkeypatch.setattr(triton_backend, "maybe_create_verify_mask",
                        lambda **kw: made.append(make(**kw)) or made[-1])
    shape = sg.Shape(context_len=131072)
    max_bs = 4
    with sg.sglang_config(shape):
        triton, ops, _ = sg.build_backends(shape)
        for backend in (triton, ops):
            backend.init_cuda_graph_state(max_bs, max_bs * shape.num_drafts)
    assert made[0] is triton.verify_mask and made[1] is None, "ours must skip Triton's buffer"
    triton_bytes = triton.verify_mask.buffer.nbytes
    ops_bytes = ops.verify_mask.buffer.nbytes
    print(f"\nverify-mask bytes at max_context_len={shape.context_len}, max_bs={max_bs}, "
          f"D={shape.num_drafts}: triton FULL_MASK {triton_bytes:,}, "
          f"verify_ops QLEN_ONLY {ops_bytes:,} (req rows {shape.req_rows}), "
          f"ratio {triton_bytes / ops_bytes:,.0f}x")
    big = dict(bs=160, num_draft_tokens=64, max_context_len=131072)
    print("  same formulas at max_bs=160, D=64: FULL_MASK "
          f"{tree_mask_numel(TreeMaskMode.FULL_MASK, *big.values()):,} B, QLEN_ONLY "
          f"{tree_mask_numel(TreeMaskMode.QLEN_ONLY, *big.values()):,} B")
    assert triton.verify_mask.mode == TreeMaskMode.FULL_MASK
    assert triton_bytes == max_bs * shape.num_drafts * (shape.context_len + shape.num_drafts)
    assert ops_bytes == max(max_bs, shape.req_rows) * shape.num_drafts ** 2
    assert triton_bytes / ops_bytes > 1000


@in_child
@pytest.mark.parametrize("case", ["NGRAM", "xai temperature"])
def test_model_level_fallbacks_keep_tritons_mask_and_count(sg, monkeypatch, caplog, case):
    from verify_ops.sglang import fallback, stats
    from verify_ops.sglang.backend import VerifyOpsAttnBackend

    monkeypatch.setattr(fallback, "_logged", set())
    monkeypatch.setenv("VERIFY_OPS_LOG_VERIFY", "1")
    stats.reset()
    shape = sg.Shape()
    layer = sg.attention_layer(shape)
    if case == "xai temperature":
        layer.xai_temperature_len = 1024
    expected = {"NGRAM": "speculative algorithm NGRAM (its drafter writes FULL_MASK)",
                "xai temperature": "xai temperature scaling"}[case]
    with sg.sglang_config(shape, "NGRAM" if case == "NGRAM" else "EAGLE"), \
            caplog.at_level("INFO"):
        triton, _, runner = sg.build_backends(shape)
        runner.model = torch.nn.ModuleList([layer])  # scanned at construction
        ops = VerifyOpsAttnBackend(runner)
        assert not ops.serves_verify and ops.verify_mask is None
        batch, tree = sg.place_batch(shape, runner, _gen(7)), sg.draft_tree(shape, _gen(8))
        q, k, v = sg.random_qkv(shape, _gen(9))
        out_triton, _, _ = _run_verify(sg, shape, triton, runner, batch, tree, q, k, v, layer)
        out_ops, _, _ = _run_verify(sg, shape, ops, runner, batch, tree, q, k, v, layer)
    assert torch.equal(out_ops, out_triton)
    messages = [r.getMessage() for r in caplog.records]
    assert sum(expected in m and "not supported" in m for m in messages) == 1
    assert messages.count(f"verify_ops: TARGET_VERIFY served by Triton fallback ({expected})") == 1
    assert stats.snapshot() == {"served": 0, "fallbacks": {expected: 1}}


@in_child
def test_forward_time_fallback_runs_triton_eagerly_counts_and_refuses_under_graphs(
        sg, monkeypatch, caplog):
    """A reason only a call shows (here ``save_kv_cache=False`` with explicit k/v):
    eagerly Triton's path serves the batch, counted and logged once per batch;
    under CUDA-graph metadata the backend refuses instead."""
    from verify_ops.sglang import fallback, stats

    monkeypatch.setattr(fallback, "_logged", set())
    monkeypatch.setenv("VERIFY_OPS_LOG_VERIFY", "1")
    stats.reset()
    shape = sg.Shape()
    reason = "save_kv_cache=False with explicit k/v"
    with sg.sglang_config(shape), caplog.at_level("INFO"):
        triton, ops, runner = sg.build_backends(shape)
        batch, tree = sg.place_batch(shape, runner, _gen(11)), sg.draft_tree(shape, _gen(12))
        q, k, v = sg.random_qkv(shape, _gen(13))
        layer = sg.attention_layer(shape)
        out_triton, _, _ = _run_verify(sg, shape, triton, runner, batch, tree, q, k, v, layer,
                                       save_kv_cache=False)
        out_ops, _, fb = _run_verify(sg, shape, ops, runner, batch, tree, q, k, v, layer,
                                     save_kv_cache=False)
        assert torch.equal(out_ops, out_triton)
        fb._attn_output = None  # fresh outputs from here on
        again = ops.forward(q, k, v, layer, fb, save_kv_cache=False)  # same batch, next layer
        assert torch.equal(again, out_triton)
        ops.init_cuda_graph_state(shape.bs, shape.bs * shape.num_drafts)
        ops.init_forward_metadata_out_graph(fb, in_capture=True)
        with pytest.raises(RuntimeError, match=f"{reason} showed up only at forward time"):
            ops.forward(q, k, v, layer, fb, save_kv_cache=False)
    messages = [r.getMessage() for r in caplog.records]
    assert sum(reason in m and "not supported" in m for m in messages) == 1
    assert messages.count(f"verify_ops: TARGET_VERIFY served by Triton fallback ({reason})") == 1
    assert stats.snapshot() == {"served": 0, "fallbacks": {reason: 1}}
