"""``VerifyOpsAttnBackend``: SGLang's Triton backend with TARGET_VERIFY on ``verify.tree_attn_out``.

Prefill, decode, draft handling and the CUDA-graph machinery are Triton's.
For TARGET_VERIFY the op reads the layer's K/V pool, ``req_to_token``,
``req_pool_indices``, ``seq_lens`` and the QLEN_ONLY tree mask in place: no
KV gather, no FULL_MASK, no host sync. The backend owns that mask as its
``verify_mask`` (inherited property), so the drafter writes into it directly.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from ..trees import qlen_only_to_full_mask
from .fragmentation_log import FragmentationLog
from .fallback import call_fallback_reason, log_fallback_once, model_fallback_reasons
from .tree_mask import allocate_verify_mask, batch_tree_mask, copy_into


class VerifyOpsAttnBackend(TritonAttnBackend):
    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf)
        self.on_cuda = torch.device(self.device).type == "cuda"
        self.tree_mask = None  # [bs, D, D] view for the current verify batch
        self.metadata_from_graph = False
        self.serves_verify = (bool(self.num_draft_tokens) and not self.is_draft_runner
                              and not skip_prefill)
        if self.serves_verify:
            reasons = model_fallback_reasons(self, model_runner)
            for reason in reasons:
                log_fallback_once(reason)
            self.serves_verify = not reasons
        if self.serves_verify:
            # Sized for every request row, so the drafter always fits (eager too).
            self._verify_mask = allocate_verify_mask(
                self.req_to_token_pool.size, self.num_draft_tokens, self.device)
        self.fragmentation_log = FragmentationLog.for_backend() if self.serves_verify else None

    def _serves(self, forward_batch) -> bool:
        spec_info = forward_batch.spec_info
        return (self.serves_verify and forward_batch.forward_mode.is_target_verify()
                and spec_info is not None and spec_info.custom_mask is not None)

    def _batch_shape(self, forward_batch) -> tuple[int, int]:
        num_drafts = self._target_verify_num_tokens_per_req(forward_batch.spec_info)
        return forward_batch.seq_lens.shape[0], num_drafts

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
            return super().init_forward_metadata(forward_batch)
        self.forward_metadata = None  # Triton's, built only if a layer falls back
        self.metadata_from_graph = False
        # The drafter's mask: the owned buffer, its own QLEN_ONLY allocation, or a
        # warmup batch's all-ones one; the first bs * D * D cells are this batch.
        self.tree_mask = batch_tree_mask(forward_batch.spec_info.custom_mask,
                                         *self._batch_shape(forward_batch))
        if self.fragmentation_log is not None:
            self.fragmentation_log.observe(self.req_to_token, forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if not self._serves(forward_batch):
            return super().init_forward_metadata_out_graph(forward_batch, in_capture)
        self.forward_metadata = None
        self.metadata_from_graph = True
        # Capture and replay both copy into the owned buffer, never rebind it.
        self.tree_mask = copy_into(self._verify_mask, forward_batch.spec_info.custom_mask,
                                   *self._batch_shape(forward_batch))
        if self.fragmentation_log is not None and not in_capture:
            self.fragmentation_log.observe(self.req_to_token, forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch):
        # Verify records nothing here: the op reads its inputs by address.
        if not self._serves(forward_batch):
            super().init_forward_metadata_in_graph(forward_batch)

    # -- forward -----------------------------------------------------------

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, sinks=None,
                       **kwargs):
        if not self._serves(forward_batch):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, sinks,
                                          **kwargs)
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        reason = call_fallback_reason(layer, self.on_cuda, q, k_cache, k, save_kv_cache, sinks,
                                      kwargs)
        if reason is not None:
            return self._forward_verify_fallback(reason, q, k, v, layer, forward_batch,
                                                 save_kv_cache, sinks, **kwargs)
        if k is not None:
            # The op reads the drafts' K/V from their pool slots, so store them first.
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)
        out = getattr(forward_batch, "_attn_output", None)
        if out is None:
            out = q.new_empty(q.shape)
        heads, head_dim = layer.tp_q_head_num, layer.qk_head_dim
        torch.ops.verify.tree_attn_out(
            q.view(-1, heads, head_dim), k_cache,
            self.token_to_kv_pool.get_value_buffer(layer.layer_id), self.req_to_token,
            forward_batch.req_pool_indices, forward_batch.seq_lens, self.tree_mask,
            layer.scaling, out.view(-1, heads, head_dim))
        return out

    def _forward_verify_fallback(self, reason, q, k, v, layer, forward_batch, save_kv_cache,
                                 sinks, **kwargs):
        log_fallback_once(reason)
        if self.metadata_from_graph:
            raise RuntimeError(
                f"verify_ops: {reason} showed up only at forward time, under CUDA-graph "
                "metadata, where Triton's fallback has no FULL_MASK. Use "
                "--attention-backend triton or --disable-cuda-graph for this model.")
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
