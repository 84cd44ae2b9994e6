"""bench/oracle.py's reference: one KV head at a time past its size limit, with
the same result as the whole."""

import torch

from bench import oracle
from bench.workload import Shape, make_workload
from verify_ops.reference import tree_attn_ref


def test_the_reference_by_kv_head_equals_the_whole(monkeypatch):
    w = make_workload(Shape(2, 60, 8, 8, 4, 64, "fragmented"), num_layers=1, device="cpu")
    whole = tree_attn_ref(*w.case(0).args())
    monkeypatch.setattr(oracle, "REFERENCE_CHUNK_ELEMS", 1)
    chunked = oracle.reference(w.case(0))
    assert chunked.dtype == torch.float64 and torch.equal(chunked, whole)


def test_a_small_case_runs_whole(monkeypatch):
    w = make_workload(Shape(1, 30, 4, 4, 2, 64, "fragmented"), num_layers=1, device="cpu")
    calls = []
    real = oracle.tree_attn_ref
    monkeypatch.setattr(oracle, "tree_attn_ref", lambda *a: calls.append(1) or real(*a))
    oracle.reference(w.case(0))
    assert calls == [1]
