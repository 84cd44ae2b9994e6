"""The kernels bench/ compares, each called as its user calls it for tree verify.

Three of them are attention functions over SGLang's native KV pool, built once
per verify step (the untimed setup: indices, masks, FlashInfer's plan) and
called once per layer; ``bench/model_step.py`` swaps them inside a model:

    attend = ATTENTIONS[name](w)          # w: a Workload (its layers unused)
    attend(q, k_new, v_new, k_cache, v_cache, out)

with q and out ``[bs*D, Hq, d]``, k_new and v_new ``[bs*D, Hkv, d]`` (the drafts'
K and V, already written to the pool at their slots; only Triton reads them)
and the caches ``[pool, Hkv, d]``, all bf16.

``METHODS[name](workload)`` does a kernel table case's setup and returns one
zero-argument call per layer, each returning that layer's output
``[bs*D, Hq, d]``. SDPA and FlexAttention get their KV gathered and masks built
beforehand, as the anchors in ../shared/anchors/ were measured. A method whose
package is missing raises MethodUnavailable, which the table reports as a skip.
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass
from typing import Callable

import torch

import verify_ops
from verify_ops.trees import qlen_only_to_full_mask

from .workload import Workload

LayerCall = Callable[[], torch.Tensor]
Attention = Callable[..., torch.Tensor]

# SGLang 0.5.23's SGLANG_FLASHINFER_WORKSPACE_SIZE default (srt/environ.py); it
# raises it to 512 MB for Qwen2/Qwen3 models, which bench/model_step.py passes.
FLASHINFER_WORKSPACE_BYTES = 384 << 20


class MethodUnavailable(RuntimeError):
    """The method's package is not importable here: its rows say so and are not timed."""


def verify_ops_attention(w: Workload) -> Attention:
    """verify_ops.tree_attn_out over the pool, as the verify_ops SGLang backend calls it."""
    args = (w.req_to_token, w.req_pool_indices, w.seq_lens, w.tree_mask, w.sm_scale)

    def attend(q, k_new, v_new, k_cache, v_cache, out):
        verify_ops.tree_attn_out(q, k_cache, v_cache, *args, out)
        return out
    return attend


def _slots(w: Workload) -> torch.Tensor:
    """[bs, L + D] slots of every request's prefix then drafts."""
    rows = w.req_to_token[w.req_pool_indices]
    return rows[:, : w.shape.seq_len + w.shape.num_drafts].long()


def triton_attention(w: Workload) -> Attention:
    """SGLang's Triton extend_attention_fwd with a FULL_MASK custom mask, as its verify runs.

    is_causal=True as TritonAttnBackend.forward_extend passes it for TARGET_VERIFY
    (sglang 0.5.23 srt/layers/attention/triton_backend.py: ``causal = True``).
    """
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except ImportError as exc:
        raise MethodUnavailable(f"sglang's Triton kernels not importable: {exc}") from None

    s = w.shape
    kv_indices = _slots(w)[:, : s.seq_len].flatten().contiguous()
    device = w.tree_mask.device
    kv_indptr = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * s.seq_len
    qo_indptr = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * s.num_drafts
    custom_mask = qlen_only_to_full_mask(w.tree_mask, w.seq_lens.cpu()).to(device)
    mask_indptr = torch.arange(0, s.batch + 1, device=device, dtype=torch.int32) * (
        s.num_drafts * (s.seq_len + s.num_drafts))

    def attend(q, k_new, v_new, k_cache, v_cache, out):
        extend_attention_fwd(q, k_new, v_new, out, k_cache, v_cache, qo_indptr, kv_indptr,
                             kv_indices, custom_mask, True, mask_indptr, s.num_drafts, 1.0, 1.0,
                             sm_scale=w.sm_scale, skip_prefix_custom_mask=True)
        return out
    return attend


@dataclass
class PagedVerifyInputs:
    """FlashInfer's paged-prefill inputs for one verify step, page_size 1, as SGLang's
    EagleVerifyInput.generate_attn_arg_prefill builds them (all int32 but the mask)."""
    qo_indptr: torch.Tensor       # [bs + 1]: D rows per request
    kv_indptr: torch.Tensor       # [bs + 1]: L + D keys per request
    kv_indices: torch.Tensor      # [sum(L + D)]: each request's req_to_token row
    last_page_len: torch.Tensor   # [bs]: ones (page_size 1)
    custom_mask: torch.Tensor     # [sum(D * (L + D))] bool: per request, per draft row,
    #                               the prefix (all visible) then the tree
    packed_mask_bytes: int        # what FlashInfer packs the mask into (a byte per 8
    #                               cells, each request's segment padded to whole bytes)


def paged_verify_inputs(w: Workload) -> PagedVerifyInputs:
    s = w.shape
    device = w.tree_mask.device
    keys = s.seq_len + s.num_drafts
    ones = torch.ones(s.batch, dtype=torch.int32, device=device)
    return PagedVerifyInputs(
        qo_indptr=torch.arange(0, s.batch + 1, dtype=torch.int32, device=device) * s.num_drafts,
        kv_indptr=torch.arange(0, s.batch + 1, dtype=torch.int32, device=device) * keys,
        kv_indices=_slots(w).flatten().to(torch.int32).contiguous(),
        last_page_len=ones,
        custom_mask=qlen_only_to_full_mask(w.tree_mask, w.seq_lens.cpu()).to(device),
        packed_mask_bytes=s.batch * -(-s.num_drafts * keys // 8))


def flashinfer_wrapper(w: Workload, inputs: PagedVerifyInputs,
                       workspace_bytes: int = FLASHINFER_WORKSPACE_BYTES):
    """A BatchPrefillWithPagedKVCacheWrapper as SGLang's graph runner makes one for
    TARGET_VERIFY (FlashInferAttnBackend._create_prefill_wrappers): NHD, fa2, CUDA-graph
    mode with fixed buffers and a custom-mask buffer."""
    try:
        import flashinfer
    except Exception as exc:  # absent, or present but broken (e.g. a missing tvm_ffi)
        raise MethodUnavailable(f"flashinfer not importable: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:120]}") from None
    device = w.tree_mask.device
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(workspace_bytes, dtype=torch.uint8, device=device), "NHD",
        use_cuda_graph=True, backend="fa2",
        qo_indptr_buf=torch.empty_like(inputs.qo_indptr),
        paged_kv_indptr_buf=torch.empty_like(inputs.kv_indptr),
        paged_kv_indices_buf=torch.empty_like(inputs.kv_indices),
        paged_kv_last_page_len_buf=torch.empty_like(inputs.last_page_len),
        custom_mask_buf=torch.empty(inputs.packed_mask_bytes, dtype=torch.uint8, device=device),
        mask_indptr_buf=torch.empty_like(inputs.qo_indptr))


def flashinfer_plan_args(w: Workload, inputs: PagedVerifyInputs) -> tuple[tuple, dict]:
    """The arguments of ``wrapper.plan``, as FlashInferIndicesUpdaterPrefill.call_begin_forward
    passes them for TARGET_VERIFY (causal left False: the custom mask rules), plus sm_scale,
    which SGLang hands to ``forward`` instead (``run`` takes it from the plan)."""
    s = w.shape
    args = (inputs.qo_indptr, inputs.kv_indptr, inputs.kv_indices, inputs.last_page_len,
            s.num_q_heads, s.num_kv_heads, s.head_dim, 1)
    kwargs = {"custom_mask": inputs.custom_mask, "q_data_type": torch.bfloat16,
              "kv_data_type": torch.bfloat16, "non_blocking": True, "sm_scale": w.sm_scale}
    return args, kwargs


def flashinfer_attention(w: Workload,
                         workspace_bytes: int = FLASHINFER_WORKSPACE_BYTES) -> Attention:
    """FlashInfer's paged prefill with a custom mask, as SGLang 0.5.23's ``flashinfer``
    backend runs TARGET_VERIFY: the KV indices are the requests' req_to_token rows
    (page_size 1) and ``plan`` runs here, outside the timed graph, as SGLang's graph
    runner plans before each replay. SGLang's ``forward`` also zero-fills a fresh output
    per layer; ``run`` writes ``out`` instead, as the other methods do."""
    inputs = paged_verify_inputs(w)
    wrapper = flashinfer_wrapper(w, inputs, workspace_bytes)
    args, kwargs = flashinfer_plan_args(w, inputs)
    wrapper.plan(*args, **kwargs)  # the first plan of a head dim JIT-compiles its module

    def attend(q, k_new, v_new, k_cache, v_cache, out):
        wrapper.run(q, (k_cache, v_cache), out=out)
        return out
    attend.wrapper = wrapper  # keeps the planned buffers alive with the calls
    return attend


# FA3 as sgl-kernel 0.4.5 ships it (built for torch 2.11 and CUDA 13): its
# flash_ops library, and common_ops for the merge SGLang runs after the cascade.
# bench/device/fa3_payload.sh brings them to the lent H200 in four calls.
FA3_DIR = os.environ.get("VERIFY_OPS_BENCH_FA3_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".devdeps", "fa3")
FA3_LIBRARIES = ("flash_ops.abi3.so", "common_ops.abi3.so")
# What both libraries link and torch may not have loaded by then (CUDA 13).
FA3_CUDA_LIBRARIES = ("libcudart.so.13", "libnvrtc.so.13", "libcublas.so.13",
                      "libcublasLt.so.13")


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.sgl_kernel, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def load_fa3() -> None:
    """Loads sgl-kernel's FA3 and merge ops from FA3_DIR, once; MethodUnavailable where
    they are absent or do not load here (the reason in the row)."""
    if _has_op("fwd") and _has_op("merge_state_v2"):
        return
    paths = [os.path.join(FA3_DIR, name) for name in FA3_LIBRARIES]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise MethodUnavailable(f"FA3 not here: {', '.join(missing)} missing "
                                "(bench/device/fa3_payload.sh brings sgl-kernel 0.4.5's)")
    torch_lib = os.path.dirname(os.path.dirname(torch.__file__))
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for name in FA3_CUDA_LIBRARIES:  # the first copy that loads; the dynamic linker may find it too
        for path in [*glob.glob(os.path.join(torch_lib, "nvidia", "**", name), recursive=True),
                     os.path.join(cuda_home, "lib64", name)]:
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
    try:
        for path in paths:
            torch.ops.load_library(path)
    except (OSError, RuntimeError) as exc:
        raise MethodUnavailable(f"FA3 did not load: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:160]}") from None


@dataclass
class Fa3VerifyInputs:
    """What SGLang's FA3 backend (flashattention_backend.py, init_forward_metadata) builds
    for TARGET_VERIFY over a page_size-1 pool, all int32. A chain (top-1) is one causal
    pass over prefix and drafts; a tree (top-k > 1) is a cascade: the prefix for all
    drafts, then each draft alone over the drafts its tree row shows ("expand"), merged
    by their log-sum-exps."""
    cu_seqlens_q: torch.Tensor        # [bs + 1]: D rows per request
    page_table: torch.Tensor          # [bs, L (+ D for a chain)]: req_to_token rows
    cache_seqlens: torch.Tensor       # [bs]: L, or L + D for a chain
    cu_seqlens_k: torch.Tensor        # [bs + 1]
    expand_cu_seqlens_q: torch.Tensor | None   # [T + 1]: one row each
    expand_page_table: torch.Tensor | None     # [T, D]: the row's visible drafts' slots
    #                                            first, in draft order
    expand_cache_seqlens: torch.Tensor | None  # [T]: how many drafts the row sees
    expand_cu_seqlens_k: torch.Tensor | None   # [T + 1]


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))


def fa3_verify_inputs(w: Workload) -> Fa3VerifyInputs:
    s = w.shape
    device = w.tree_mask.device
    chain = s.tree == "chain"
    keys = s.seq_len + (s.num_drafts if chain else 0)
    rows = w.req_to_token[w.req_pool_indices]
    cache_seqlens = torch.full((s.batch,), keys, dtype=torch.int32, device=device)
    common = dict(
        cu_seqlens_q=torch.arange(0, s.batch * s.num_drafts + 1, s.num_drafts,
                                  dtype=torch.int32, device=device),
        page_table=rows[:, :keys].to(torch.int32).contiguous(),
        cache_seqlens=cache_seqlens, cu_seqlens_k=_cumulative(cache_seqlens))
    if chain:
        return Fa3VerifyInputs(**common, expand_cu_seqlens_q=None, expand_page_table=None,
                               expand_cache_seqlens=None, expand_cu_seqlens_k=None)
    visible = w.tree_mask.reshape(-1, s.num_drafts)  # [T, D]
    columns = torch.arange(s.num_drafts, device=device).expand_as(visible)
    order = torch.sort(torch.where(visible, columns, columns + s.num_drafts), dim=1).indices
    drafts = rows[:, s.seq_len:s.seq_len + s.num_drafts].repeat_interleave(s.num_drafts, dim=0)
    expand_seqlens = visible.sum(dim=1).to(torch.int32)
    return Fa3VerifyInputs(
        **common,
        expand_cu_seqlens_q=torch.arange(0, visible.shape[0] + 1, dtype=torch.int32,
                                         device=device),
        expand_page_table=drafts.gather(1, order).to(torch.int32).contiguous(),
        expand_cache_seqlens=expand_seqlens, expand_cu_seqlens_k=_cumulative(expand_seqlens))


def _fa3_forward(q, k_cache, v_cache, out, cu_seqlens_q, cu_seqlens_k, cache_seqlens,
                 max_seqlen_q, page_table, sm_scale, causal, return_lse):
    """torch.ops.sgl_kernel.fwd as sgl_kernel.flash_attn.flash_attn_with_kvcache (0.4.5)
    calls it for SGLang: no new K/V, no rotary, no descales, the heuristic split count
    (num_splits 0), pack_gqa and scheduler metadata left to the kernel."""
    result = torch.ops.sgl_kernel.fwd.default(
        q, k_cache, v_cache, None, None, None, out, cu_seqlens_q, None, cu_seqlens_k, None,
        cache_seqlens, max_seqlen_q, None, page_table, None, None, None, None, None, None,
        None, None, sm_scale, causal, -1, -1, 0, 0.0, True, None, 0, None, 0, None, None,
        False)
    return (result[0], result[1]) if return_lse else result[0]


def fa3_attention(w: Workload) -> Attention:
    """FA3 (sgl-kernel's flash_ops) as SGLang 0.5.23's ``fa3`` backend runs TARGET_VERIFY
    over a page_size-1 pool: one causal pass for a chain; for a tree the prefix pass and
    the expand pass, merged by sgl_kernel's merge_state_v2, as its forward_extend does."""
    load_fa3()
    s = w.shape
    inputs = fa3_verify_inputs(w)
    tokens = s.batch * s.num_drafts
    merged_lse = torch.empty(tokens, s.num_q_heads, dtype=torch.float32,
                             device=w.tree_mask.device)

    def attend(q, k_new, v_new, k_cache, v_cache, out):
        # The pool as pages of one token: [pool, 1, Hkv, d].
        k_pages, v_pages = k_cache.unsqueeze(1), v_cache.unsqueeze(1)
        if inputs.expand_page_table is None:
            return _fa3_forward(q, k_pages, v_pages, out, inputs.cu_seqlens_q,
                                inputs.cu_seqlens_k, inputs.cache_seqlens, s.num_drafts,
                                inputs.page_table, w.sm_scale, True, False)
        prefix, prefix_lse = _fa3_forward(
            q, k_pages, v_pages, None, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
            inputs.cache_seqlens, s.num_drafts, inputs.page_table, w.sm_scale, False, True)
        tree, tree_lse = _fa3_forward(
            q, k_pages, v_pages, None, inputs.expand_cu_seqlens_q, inputs.expand_cu_seqlens_k,
            inputs.expand_cache_seqlens, 1, inputs.expand_page_table, w.sm_scale, False, True)
        torch.ops.sgl_kernel.merge_state_v2.default(
            prefix, prefix_lse.T.contiguous(), tree, tree_lse.T.contiguous(), out, merged_lse)
        return out
    return attend


ATTENTIONS: dict[str, Callable[[Workload], Attention]] = {
    "verify_ops": verify_ops_attention,
    "triton": triton_attention,
    "flashinfer": flashinfer_attention,
    "fa3": fa3_attention,
}


def _layer_calls(w: Workload, attend: Attention, with_drafts: bool) -> list[LayerCall]:
    """One call per layer of ``w``; ``with_drafts``: the drafts' K and V are copied out
    of the pool beforehand, as the projection that wrote them would have left them."""
    slots = w.draft_slots() if with_drafts else None
    calls = []
    for layer in w.layers:
        out = torch.full_like(layer.q, float("nan"))  # a row the check finds unwritten fails
        k_new = layer.k_cache[slots].contiguous() if with_drafts else None
        v_new = layer.v_cache[slots].contiguous() if with_drafts else None

        def call(layer=layer, k_new=k_new, v_new=v_new, out=out):
            return attend(layer.q, k_new, v_new, layer.k_cache, layer.v_cache, out)
        calls.append(call)
    return calls


def prepare_verify_ops(w: Workload) -> list[LayerCall]:
    return _layer_calls(w, verify_ops_attention(w), with_drafts=False)


def prepare_triton(w: Workload) -> list[LayerCall]:
    return _layer_calls(w, triton_attention(w), with_drafts=True)


def prepare_fa3(w: Workload) -> list[LayerCall]:
    return _layer_calls(w, fa3_attention(w), with_drafts=False)


def prepare_flashinfer(w: Workload) -> list[LayerCall]:
    calls = _layer_calls(w, flashinfer_attention(w), with_drafts=False)
    import flashinfer  # importable: flashinfer_attention raised MethodUnavailable otherwise

    calls[0].note = f"flashinfer {flashinfer.__version__}, fa2, page_size 1, custom mask"
    return calls


def _gathered(w: Workload, layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q as [bs, Hq, D, d]; K and V gathered as [bs, Hkv, L + D, d]."""
    s = w.shape
    slots = _slots(w)
    q = layer.q.view(s.batch, s.num_drafts, s.num_q_heads, s.head_dim).transpose(1, 2)
    k = layer.k_cache[slots].transpose(1, 2).contiguous()
    v = layer.v_cache[slots].transpose(1, 2).contiguous()
    return q.contiguous(), k, v


def _visible(w: Workload) -> torch.Tensor:
    """[bs, 1, D, L + D] bool: the prefix is visible, drafts by the tree."""
    s = w.shape
    prefix = torch.ones(s.batch, s.num_drafts, s.seq_len, dtype=torch.bool,
                        device=w.tree_mask.device)
    return torch.cat([prefix, w.tree_mask], dim=2).unsqueeze(1)


def _as_rows(out: torch.Tensor) -> torch.Tensor:
    b, h, d_count, dim = out.shape
    return out.transpose(1, 2).reshape(b * d_count, h, dim)


def prepare_sdpa(w: Workload) -> list[LayerCall]:
    visible = _visible(w)
    calls = []
    for layer in w.layers:
        q, k, v = _gathered(w, layer)

        def call(q=q, k=k, v=v):
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=visible, scale=w.sm_scale, enable_gqa=True)
            return _as_rows(out)
        calls.append(call)
    return calls


# For short queries Flex picks its decoding kernel, which found no valid
# configuration (NoValidChoicesError) at D32-D64 with GQA on torch 2.11; its
# main kernel is then tried instead, and the row says so.
FLEX_FALLBACK_OPTIONS = {"FORCE_USE_FLEX_ATTENTION": True}


def prepare_flex(w: Workload) -> list[LayerCall]:
    """FlexAttention, compiled, with the tree as a mask_mod and the block mask built beforehand."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    s = w.shape
    tree_mask = w.tree_mask

    def mask_mod(b, h, q_idx, kv_idx):
        draft = (kv_idx - s.seq_len).clamp(min=0)
        return (kv_idx < s.seq_len) | tree_mask[b, q_idx, draft]

    block_mask = create_block_mask(mask_mod, B=s.batch, H=None, Q_LEN=s.num_drafts,
                                   KV_LEN=s.seq_len + s.num_drafts, device=w.tree_mask.device)
    gathered = [_gathered(w, layer) for layer in w.layers]
    for kernel_options in (None, FLEX_FALLBACK_OPTIONS):
        # Each case is a new static shape, so a compile of its own: past dynamo's
        # recompile limit (8) one shared compiled function falls back to eager
        # flex_attention, which cannot be captured in a CUDA graph.
        torch._dynamo.reset()
        flex_compiled = torch.compile(flex_attention, dynamic=False)
        calls = []
        for q, k, v in gathered:
            def call(q=q, k=k, v=v, flex=flex_compiled, kernel_options=kernel_options):
                out = flex(q, k, v, block_mask=block_mask, scale=w.sm_scale, enable_gqa=True,
                           kernel_options=kernel_options)
                return _as_rows(out)
            calls.append(call)
        try:
            calls[0]()  # compiles here, untimed
        except Exception:
            if kernel_options is not None:
                raise
            continue
        if kernel_options is not None:
            calls[0].note = f"kernel_options={kernel_options} (the default found no kernel)"
        return calls


METHODS = {
    "verify_ops": prepare_verify_ops,
    "flashinfer": prepare_flashinfer,
    "fa3": prepare_fa3,
    "triton": prepare_triton,
    "flex": prepare_flex,
    "sdpa": prepare_sdpa,
}
