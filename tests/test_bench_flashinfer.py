"""bench/methods.py's FlashInfer method on the CPU: the paged inputs it plans with
mean the tree verify (checked by attending through them in float64), the wrapper
takes its buffers, plan() takes its arguments, and an absent package is a skip.
It runs on the GPU in tests/test_bench_checks.py."""

import inspect
import sys

import pytest
import torch

from bench.methods import (MethodUnavailable, flashinfer_plan_args, flashinfer_wrapper,
                           paged_verify_inputs)
from bench.oracle import reference
from bench.workload import Shape, make_workload
from verify_ops.reference import relative_error

SHAPES = [Shape(3, 37, 8, 8, 2, 64, "fragmented"),
          Shape(2, 50, 4, 4, 1, 128, "contiguous", "chain"),
          Shape(1, 0, 16, 4, 4, 64, "fragmented")]


def _attend_paged(w, inputs) -> torch.Tensor:
    """What FlashInfer computes from the paged inputs (page_size 1), in float64."""
    s, lay = w.shape, w.layers[0]
    group = s.num_q_heads // s.num_kv_heads
    out = torch.zeros(lay.q.shape, dtype=torch.float64)
    mask_at = 0
    for b in range(s.batch):
        rows = slice(int(inputs.qo_indptr[b]), int(inputs.qo_indptr[b + 1]))
        slots = inputs.kv_indices[int(inputs.kv_indptr[b]):int(inputs.kv_indptr[b + 1])].long()
        keys = len(slots)
        visible = inputs.custom_mask[mask_at:mask_at + s.num_drafts * keys].view(s.num_drafts, keys)
        mask_at += s.num_drafts * keys
        k = lay.k_cache[slots].double().repeat_interleave(group, dim=1)
        v = lay.v_cache[slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("ihd,thd->hit", lay.q[rows].double(), k) * w.sm_scale
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = torch.einsum("hit,thd->ihd", probs, v)
    assert mask_at == inputs.custom_mask.numel()
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label())
def test_the_paged_inputs_attend_as_the_tree_verify(shape):
    w = make_workload(shape, num_layers=1, device="cpu")
    inputs = paged_verify_inputs(w)
    keys = shape.seq_len + shape.num_drafts
    assert inputs.kv_indices.dtype == torch.int32 and inputs.kv_indptr.tolist() == [
        b * keys for b in range(shape.batch + 1)]
    assert inputs.last_page_len.tolist() == [1] * shape.batch
    assert inputs.packed_mask_bytes == shape.batch * -(-shape.num_drafts * keys // 8)
    assert relative_error(_attend_paged(w, inputs), reference(w.case(0))) < 1e-12


def test_the_paged_inputs_miss_a_dropped_tree():
    """The emulation above can fail: with the tree's cells cleared the output moves."""
    w = make_workload(SHAPES[0], num_layers=1, device="cpu")
    inputs = paged_verify_inputs(w)
    s = w.shape
    per_request = inputs.custom_mask.view(s.batch, s.num_drafts, s.seq_len + s.num_drafts)
    per_request[:, :, s.seq_len:] = torch.eye(s.num_drafts, dtype=torch.bool)  # self only
    assert relative_error(_attend_paged(w, inputs), reference(w.case(0))) > 1e-2


@pytest.fixture
def flashinfer_on_cpu(monkeypatch):
    """flashinfer, with the pinned host buffer its wrapper allocates made plain
    (pinning needs a CUDA driver)."""
    flashinfer = pytest.importorskip("flashinfer")
    if not torch.cuda.is_available():
        empty = torch.empty

        def unpinned(*args, pin_memory=False, **kwargs):
            return empty(*args, **kwargs)
        monkeypatch.setattr(torch, "empty", unpinned)
    return flashinfer


def test_the_wrapper_is_built_as_sglangs_graph_runner_builds_it(flashinfer_on_cpu):
    w = make_workload(SHAPES[0], num_layers=1, device="cpu")
    inputs = paged_verify_inputs(w)
    wrapper = flashinfer_wrapper(w, inputs, workspace_bytes=1 << 20)
    assert isinstance(wrapper, flashinfer_on_cpu.BatchPrefillWithPagedKVCacheWrapper)
    assert wrapper.is_cuda_graph_enabled and wrapper._backend == "fa2"
    assert wrapper._kv_layout == "NHD" and wrapper._fixed_batch_size == w.shape.batch
    assert wrapper._custom_mask_buf.numel() == inputs.packed_mask_bytes
    assert wrapper._paged_kv_indices_buf.shape == inputs.kv_indices.shape
    args, kwargs = flashinfer_plan_args(w, inputs)
    bound = inspect.signature(wrapper.plan).bind(*args, **kwargs).arguments
    assert bound["page_size"] == 1 and bound["custom_mask"] is inputs.custom_mask
    assert "causal" not in bound  # left at False, as SGLang's plan leaves it
    assert bound["q_data_type"] == bound["kv_data_type"] == torch.bfloat16
    assert bound["sm_scale"] == w.sm_scale


def test_an_absent_flashinfer_is_a_skip_that_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    w = make_workload(SHAPES[0], num_layers=1, device="cpu")
    with pytest.raises(MethodUnavailable, match="flashinfer not importable"):
        flashinfer_wrapper(w, paged_verify_inputs(w))
