"""bench/methods.py's FA3 method on the CPU: the page tables it hands FA3 mean the
tree verify (checked by attending through them in float64: a causal pass for a
chain, the prefix and expand passes merged by their log-sum-exps for a tree), and
an absent library is a skip that says why. It runs on the GPU in
tests/test_bench_checks.py where bench/device/fa3_payload.sh brought it."""

import pytest
import torch

from bench import methods
from bench.methods import MethodUnavailable, fa3_verify_inputs
from bench.oracle import reference
from bench.workload import Shape, make_workload
from verify_ops.reference import relative_error


def _attend(q, k, v, scale, visible):
    """float64 attention of q [rows, Hq, d] over k, v [keys, Hkv, d]: (out, lse [rows, Hq])."""
    group = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.einsum("ihd,thd->iht", q.double(), k) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("iht,thd->ihd", torch.softmax(scores, dim=-1).nan_to_num(0.0), v), lse


def _fa3_through_the_tables(w, inputs) -> torch.Tensor:
    s, lay = w.shape, w.layers[0]
    out = torch.zeros(lay.q.shape, dtype=torch.float64)
    for b in range(s.batch):
        rows = slice(int(inputs.cu_seqlens_q[b]), int(inputs.cu_seqlens_q[b + 1]))
        slots = inputs.page_table[b, :int(inputs.cache_seqlens[b])].long()
        keys = len(slots)
        if inputs.expand_page_table is None:  # causal, the queries at the end of the keys
            visible = (torch.arange(keys)[None, :]
                       <= keys - s.num_drafts + torch.arange(s.num_drafts)[:, None])
            out[rows] = _attend(lay.q[rows], lay.k_cache[slots], lay.v_cache[slots],
                                w.sm_scale, visible)[0]
            continue
        prefix, prefix_lse = _attend(lay.q[rows], lay.k_cache[slots], lay.v_cache[slots],
                                     w.sm_scale, torch.ones(s.num_drafts, keys, dtype=torch.bool))
        for i in range(rows.start, rows.stop):
            seen = inputs.expand_page_table[i, :int(inputs.expand_cache_seqlens[i])].long()
            tree, tree_lse = _attend(lay.q[i:i + 1], lay.k_cache[seen], lay.v_cache[seen],
                                     w.sm_scale, torch.ones(1, len(seen), dtype=torch.bool))
            a, c = prefix_lse[i - rows.start], tree_lse[0]
            m = torch.maximum(a, c)
            wa, wc = (a - m).exp(), (c - m).exp()
            out[i] = (prefix[i - rows.start] * wa[:, None] + tree[0] * wc[:, None]) / (
                wa + wc)[:, None]
    return out


@pytest.mark.parametrize("shape", [Shape(3, 37, 8, 8, 2, 64, "fragmented"),
                                   Shape(2, 50, 16, 4, 1, 128, "contiguous"),
                                   Shape(2, 41, 4, 8, 2, 64, "fragmented", "chain")],
                         ids=lambda s: s.label())
def test_the_tables_attend_as_the_tree_verify(shape):
    w = make_workload(shape, num_layers=1, device="cpu")
    inputs = fa3_verify_inputs(w)
    chain = shape.tree == "chain"
    assert (inputs.expand_page_table is None) == chain
    assert inputs.page_table.dtype == torch.int32
    assert inputs.cache_seqlens.tolist() == [shape.seq_len + (shape.num_drafts if chain else 0)
                                             ] * shape.batch
    if not chain:  # each row's visible drafts come first, in draft order
        assert inputs.expand_cache_seqlens.tolist() == w.tree_mask.sum(-1).flatten().tolist()
    assert relative_error(_fa3_through_the_tables(w, inputs), reference(w.case(0))) < 1e-12


def test_a_page_table_that_ignores_the_tree_is_caught():
    w = make_workload(Shape(2, 37, 8, 8, 2, 64, "fragmented"), num_layers=1, device="cpu")
    inputs = fa3_verify_inputs(w)
    inputs.expand_cache_seqlens[:] = w.shape.num_drafts  # every draft sees every draft
    assert relative_error(_fa3_through_the_tables(w, inputs), reference(w.case(0))) > 1e-2


def test_fa3_absent_is_a_skip_that_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(methods, "FA3_DIR", str(tmp_path))
    monkeypatch.setattr(methods, "_has_op", lambda name: False)
    w = make_workload(Shape(1, 20, 4, 4, 1, 64, "fragmented"), num_layers=1, device="cpu")
    with pytest.raises(MethodUnavailable, match="fa3_payload.sh"):
        methods.prepare_fa3(w)
