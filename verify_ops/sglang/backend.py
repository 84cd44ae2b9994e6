"""``VerifyOpsAttnBackend``: SGLang's Triton backend with TARGET_VERIFY on ``verify.tree_attn_out``.

Prefill, decode, draft handling and the CUDA-graph machinery are Triton's.
For TARGET_VERIFY the op reads the layer's K/V pool, ``req_to_token``,
``req_pool_indices``, ``seq_lens`` and the QLEN_ONLY tree mask in place: no
KV gather, no FULL_MASK, no host sync. The backend owns that mask as its
``verify_mask`` (inherited property), so the drafter writes into it directly.

Served per layer: fp8 KV caches (the layer's ``k_scale`` / ``v_scale``
tensors, None = 1.0), ``logit_cap`` (tanh), attention ``sinks`` passed per
call, sliding windows (``layer.sliding_window_size``, on a plain pool or on
SGLang's hybrid SWA pool through :mod:`.swa_window`), and paged pools of any
page size. What falls back, and why, is in :mod:`.fallback`.

Environment: ``VERIFY_OPS_LOG_VERIFY=1`` logs one INFO line per TARGET_VERIFY
batch, ``verify_ops: TARGET_VERIFY served by tree_attn (bs=<bs>, D=<D>)`` or
``verify_ops: TARGET_VERIFY served by Triton fallback (<reason>)``; the counts
are always kept in :mod:`.stats`. ``VERIFY_OPS_DEFRAG`` is :mod:`.defrag`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

from ..trees import qlen_only_to_full_mask
from . import stats
from .compat import kv_write_loc, num_tokens_per_req
from .fallback import (
    FP8_KV_DTYPES,
    call_fallback_reason,
    log_fallback_once,
    model_fallback_reasons,
)
from .fragmentation_log import FragmentationLog
from .swa_window import WindowTable, is_window_pool_layer, window_table
from .tree_mask import allocate_verify_mask, batch_tree_mask, copy_into


@dataclass
class _VerifyBatch:
    """The TARGET_VERIFY batch whose metadata was prepared last."""
    bs: int  # requests, CUDA-graph padding excluded
    num_drafts: int
    counted: bool = False  # in stats, as served or under its first fallback
    fallbacks: set = field(default_factory=set)
    window: Optional[WindowTable] = None  # hybrid SWA pools only


class VerifyOpsAttnBackend(TritonAttnBackend):
    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf)
        self.on_cuda = torch.device(self.device).type == "cuda"
        self.tree_mask = None  # [bs, D, D] view for the current verify batch
        self.metadata_from_graph = False
        self.batch: Optional[_VerifyBatch] = None
        # The target model's verify backend (not a drafter's, not a decode-only one).
        self.verifies = (bool(self.num_draft_tokens) and not self.is_draft_runner
                         and not skip_prefill)
        self.model_fallback = None
        if self.verifies:
            reasons = model_fallback_reasons(self, model_runner)
            for reason in reasons:
                log_fallback_once(reason)
            self.model_fallback = "; ".join(reasons) or None
        self.serves_verify = self.verifies and self.model_fallback is None
        if self.serves_verify:
            # Sized for every request row, so the drafter always fits (eager too).
            self._verify_mask = allocate_verify_mask(
                self.req_to_token_pool.size, self.num_draft_tokens, self.device)
        # The widest window of the window layers: the translated tables' width.
        self.window_table_width = max_window(self, getattr(model_runner, "model", None))
        self.fragmentation_log = FragmentationLog.for_backend() if self.serves_verify else None

    def _serves(self, forward_batch) -> bool:
        spec_info = forward_batch.spec_info
        return (self.serves_verify and forward_batch.forward_mode.is_target_verify()
                and spec_info is not None and spec_info.custom_mask is not None)

    def _batch_shape(self, forward_batch) -> tuple[int, int]:
        return (forward_batch.seq_lens.shape[0],
                num_tokens_per_req(self, forward_batch.spec_info))

    def _count_fallback_batch(self, forward_batch) -> None:
        """A TARGET_VERIFY batch this verify backend hands to Triton whole."""
        if not (self.verifies and forward_batch.forward_mode.is_target_verify()):
            return
        spec_info = forward_batch.spec_info
        if self.model_fallback is not None:
            stats.record_fallback(self.model_fallback)
        elif spec_info is None or spec_info.custom_mask is None:
            stats.record_fallback("a TARGET_VERIFY batch without a tree mask")

    def _new_batch(self, forward_batch) -> _VerifyBatch:
        bs, num_drafts = self._batch_shape(forward_batch)
        padding = getattr(forward_batch, "num_padding", 0) or 0
        return _VerifyBatch(bs=bs - padding, num_drafts=num_drafts)

    # -- metadata ----------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None,
                              cuda_graph_num_kv_splits_buf=None):
        if not self.serves_verify:
            return super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf,
                                                 cuda_graph_num_kv_splits_buf)
        own_mask, num_draft_tokens = self._verify_mask, self.num_draft_tokens
        self.num_draft_tokens = None  # Triton then allocates no FULL_MASK buffer
        try:
            super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf,
                                          cuda_graph_num_kv_splits_buf)
        finally:
            self.num_draft_tokens = num_draft_tokens
        # Before any capture, so growing it here rebinds nothing captured.
        self._verify_mask = (own_mask if own_mask.fits(max_bs)
                             else allocate_verify_mask(max_bs, num_draft_tokens, self.device))

    def init_forward_metadata(self, forward_batch):
        if not self._serves(forward_batch):
            self._count_fallback_batch(forward_batch)
            return super().init_forward_metadata(forward_batch)
        self.forward_metadata = None  # Triton's, built only if a layer falls back
        self.metadata_from_graph = False
        # The drafter's mask: the owned buffer, its own QLEN_ONLY allocation, or a
        # warmup batch's all-ones one; the first bs * D * D cells are this batch.
        self.tree_mask = batch_tree_mask(forward_batch.spec_info.custom_mask,
                                         *self._batch_shape(forward_batch))
        self.batch = self._new_batch(forward_batch)  # counted at its first layer
        self.batch.window = self._window_table(forward_batch)
        if self.fragmentation_log is not None:
            self.fragmentation_log.observe(self.req_to_token, forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if not self._serves(forward_batch):
            if not in_capture:
                self._count_fallback_batch(forward_batch)
            return super().init_forward_metadata_out_graph(forward_batch, in_capture)
        self.forward_metadata = None
        self.metadata_from_graph = True
        # Capture and replay both copy into the owned buffer, never rebind it.
        self.tree_mask = copy_into(self._verify_mask, forward_batch.spec_info.custom_mask,
                                   *self._batch_shape(forward_batch))
        self.batch = self._new_batch(forward_batch)
        capturing = in_capture or (torch.cuda.is_available()
                                   and torch.cuda.is_current_stream_capturing())
        if not capturing:
            # A forward-time fallback would have failed the capture: the replay is the op's.
            self.batch.counted = True
            stats.record_served(self.batch.bs, self.batch.num_drafts)
            if self.fragmentation_log is not None:
                self.fragmentation_log.observe(self.req_to_token, forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch):
        if not self._serves(forward_batch):
            return super().init_forward_metadata_in_graph(forward_batch)
        # Captured: the window tables are rebuilt on the device at every replay.
        self.batch.window = self._window_table(forward_batch)

    def _window_table(self, forward_batch) -> Optional[WindowTable]:
        if not self.use_sliding_window_kv_pool:
            return None
        return window_table(self.token_to_kv_pool.full_to_swa_index_mapping, self.req_to_token,
                            forward_batch.req_pool_indices, forward_batch.seq_lens,
                            forward_batch.out_cache_loc, self.window_table_width,
                            self.batch.num_drafts)

    # -- forward -----------------------------------------------------------

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None,
                       **kwargs):
        if not self._serves(forward_batch):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks,
                                          **kwargs)
        pool = self.token_to_kv_pool
        k_cache = pool.get_key_buffer(layer.layer_id)
        reason = call_fallback_reason(layer, self.on_cuda, q, k_cache, k, save_kv_cache, kwargs)
        in_window_pool = is_window_pool_layer(pool, layer.layer_id)
        if reason is None and in_window_pool and layer.sliding_window_size > self.window_table_width:
            reason = (f"a window of {layer.sliding_window_size} tokens, wider than the model's "
                      f"{self.window_table_width} that the window tables were built for")
        if reason is not None:
            return self._forward_verify_fallback(reason, q, k, v, layer, forward_batch,
                                                 save_kv_cache, sinks, **kwargs)
        batch = self.batch
        if not (batch.counted or self.metadata_from_graph):  # graphs count per replay
            batch.counted = True
            stats.record_served(batch.bs, batch.num_drafts)
        window = batch.window if in_window_pool else None
        if k is not None:
            # The op reads the drafts' K/V from their pool slots, so store them first.
            swa_loc = batch.window.out_cache_loc if batch.window is not None else None
            pool.set_kv_buffer(layer, kv_write_loc(forward_batch, swa_loc), k, v,
                               *kv_scales(layer))
        out = getattr(forward_batch, "_attn_output", None)
        if out is None:
            out = q.new_empty(q.shape)
        heads, head_dim = layer.tp_q_head_num, layer.qk_head_dim
        k_scale, v_scale = op_kv_scales(layer, q, k_cache)
        if sinks is not None and sinks.dtype != torch.float32:
            sinks = sinks.float()  # the models keep them in bf16; the op takes fp32
        rows = window if window is not None else forward_batch
        torch.ops.verify.tree_attn_out(
            q.view(-1, heads, head_dim), k_cache, pool.get_value_buffer(layer.layer_id),
            window.req_to_token if window is not None else self.req_to_token,
            rows.req_pool_indices, rows.seq_lens, self.tree_mask, layer.scaling,
            out.view(-1, heads, head_dim), k_scale=k_scale, v_scale=v_scale,
            logit_cap=float(layer.logit_cap or 0.0), sinks=sinks,
            sliding_window=sliding_window_of(layer))
        return out

    def _forward_verify_fallback(self, reason, q, k, v, layer, forward_batch, save_kv_cache,
                                 sinks, **kwargs):
        log_fallback_once(reason)
        if self.metadata_from_graph:
            raise RuntimeError(
                f"verify_ops: {reason} showed up only at forward time, under CUDA-graph "
                "metadata, where Triton's fallback has no FULL_MASK. Use "
                "--attention-backend triton or --disable-cuda-graph for this model.")
        batch = self.batch
        if reason not in batch.fallbacks:
            batch.fallbacks.add(reason)
            batch.counted = True
            stats.record_fallback(reason)
        if self.forward_metadata is None:
            self._init_triton_verify_metadata(forward_batch)
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks,
                                      **kwargs)

    def _init_triton_verify_metadata(self, forward_batch):
        # Triton reads FULL_MASK: expand the tree mask once per batch (eager only).
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is None:
            seq_lens_cpu = forward_batch.seq_lens.cpu()
        spec_info = forward_batch.spec_info
        qlen_mask = spec_info.custom_mask
        spec_info.custom_mask = qlen_only_to_full_mask(self.tree_mask, seq_lens_cpu)
        try:
            super().init_forward_metadata(forward_batch)
        finally:
            spec_info.custom_mask = qlen_mask


def sliding_window_of(layer) -> int:
    window = layer.sliding_window_size
    return -1 if window is None or window < 0 else int(window)


def max_window(backend, model) -> int:
    """The widest window of the model's layers (or the runner's), 0 without one."""
    from sglang.srt.layers.radix_attention import RadixAttention

    windows = [backend.sliding_window_size or 0]
    if model is not None:
        windows += [sliding_window_of(m) for m in model.modules() if isinstance(m, RadixAttention)]
    return max(0, *windows)


def kv_scales(layer) -> tuple:
    """``set_kv_buffer``'s scale arguments: the layer's, as Triton passes them."""
    if layer.k_scale is None:
        return ()
    return layer.k_scale, layer.v_scale


def op_kv_scales(layer, q: torch.Tensor, k_cache: torch.Tensor):
    """The op's ``k_scale`` / ``v_scale``: the layer's scale tensors where the pool
    stores K/V divided by them (an fp8 pool: ``set_kv_buffer`` divides only when it
    casts), else None (= 1.0). Tensors, so a captured graph reads their values."""
    if layer.k_scale is None or k_cache.dtype not in FP8_KV_DTYPES:
        return None, None
    return tuple(scale.to(device=q.device, dtype=torch.float32).reshape(1)
                 for scale in (layer.k_scale, layer.v_scale))
