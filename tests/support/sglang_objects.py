"""Real SGLang objects for the backend tests and benchmark: pools, a stand-in
ModelRunner, an EAGLE (topk > 1) TARGET_VERIFY batch, and the static inputs
SGLang's decode graph runner captures a verify graph over. Everything lives on
``Shape.device``. On CPU import it only once
``TRITON_INTERPRET=1`` is set, since Triton picks its interpreter when SGLang's
kernels are defined; on CUDA SGLang's kernels run compiled.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import torch
try:  # the tree kernel's home moved between SGLang 0.5.17 and 0.5.23
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton
except ImportError:
    from sglang.srt.speculative.eagle_utils import TreeMaskMode, sgl_build_tree_kernel_triton
from sglang.srt.configs.model_config import AttentionArch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view
from sglang.srt.runtime_context import get_context, get_parallel, get_server_args
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.eagle_utils import organize_draft_results
from sglang.srt.speculative.spec_utils import select_top_k_tokens

from verify_ops import tree_attn_ref
from verify_ops.sglang.backend import VerifyOpsAttnBackend
from verify_ops.sglang.compat import alloc_req_rows
from verify_ops.sglang.tree_mask import allocate_verify_mask


@dataclass(frozen=True)
class Shape:
    prefix_lens: tuple[int, ...] = (37, 0, 1, 12)  # ragged, incl. 0 and 1
    topk: int = 3
    steps: int = 3
    num_drafts: int = 7  # D, root included
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    context_len: int = 128
    req_rows: int = 6
    pool_slots: int = 400
    dtype: torch.dtype = torch.float16
    device: str = "cpu"
    layer_num: int = 1  # KV pool layers; each has its own K/V buffers
    kv_dtype: Optional[torch.dtype] = None  # the KV pool's (fp8); None: ``dtype``
    page_size: int = 1
    # Layers whose K/V live in the sliding-window sub-pool of an SWAKVPool
    # (``window`` tokens); none: one MHATokenToKVPool.
    swa_layers: tuple[int, ...] = ()
    window: Optional[int] = None  # the runner's sliding_window_size

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.kv_dtype or self.dtype

    @property
    def bs(self) -> int:
        return len(self.prefix_lens)


@contextlib.contextmanager
def sglang_config(shape: Shape, algorithm: str = "EAGLE"):
    """Publish the server args the backends read (single rank, EAGLE topk > 1)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(get_context().override_server_args(
            attention_backend="verify_ops", speculative_algorithm=algorithm,
            speculative_eagle_topk=shape.topk, speculative_num_steps=shape.steps,
            speculative_num_draft_tokens=shape.num_drafts, triton_attention_num_kv_splits=8,
            tp_size=1))
        stack.enter_context(get_parallel().override(attn_tp_size=1, attn_dcp_rank=0))
        yield


def stand_in_runner(shape: Shape, model=None) -> SimpleNamespace:
    """Exactly the ModelRunner attributes TritonAttnBackend.__init__ reads, over real pools."""
    hf_config = SimpleNamespace(architectures=["LlamaForCausalLM"])
    hf_config.get_text_config = lambda: hf_config
    model_config = SimpleNamespace(
        attention_arch=AttentionArch.MHA, hf_config=hf_config, head_dim=shape.head_dim,
        v_head_dim=shape.head_dim, swa_v_head_dim=shape.head_dim,
        context_len=shape.context_len, is_encoder_decoder=False,
        linear_attn_registry_result=None,
        get_max_num_attention_heads=lambda: shape.num_q_heads,
        get_num_kv_heads=lambda tp_size, dcp_size=1: shape.num_kv_heads)
    device, page_size = shape.device, shape.page_size
    req_to_token_pool = ReqToTokenPool(size=shape.req_rows, max_context_len=shape.context_len,
                                       device=device, enable_memory_saver=False)
    pool_args = dict(page_size=page_size, dtype=shape.cache_dtype, head_num=shape.num_kv_heads,
                     head_dim=shape.head_dim, device=device, enable_alt_stream=False)
    alloc_args = dict(dtype=shape.cache_dtype, device=device, need_sort=False)
    if shape.swa_layers:
        full_layers = [i for i in range(shape.layer_num) if i not in shape.swa_layers]
        kv_pool = SWAKVPool(size=shape.pool_slots, size_swa=shape.pool_slots,
                            swa_attention_layer_ids=list(shape.swa_layers),
                            full_attention_layer_ids=full_layers, **pool_args)
        allocator = SWATokenToKVPoolAllocator(size=shape.pool_slots, size_swa=shape.pool_slots,
                                              page_size=page_size, kvcache=kv_pool, **alloc_args)
        # Hold some window slots back, so that a full slot and its window slot differ.
        allocator.swa_attn_allocator.alloc(shape.pool_slots // 8)
    else:
        kv_pool = MHATokenToKVPool(size=shape.pool_slots, layer_num=shape.layer_num,
                                   enable_memory_saver=False, **pool_args)
        if page_size == 1:
            allocator = TokenToKVPoolAllocator(size=shape.pool_slots, kvcache=kv_pool,
                                               **alloc_args)
        else:
            allocator = PagedTokenToKVPoolAllocator(size=shape.pool_slots, page_size=page_size,
                                                    kvcache=kv_pool, **alloc_args)
    runner = SimpleNamespace(
        req_to_token_pool=req_to_token_pool, token_to_kv_pool=kv_pool,
        token_to_kv_pool_allocator=allocator, sliding_window_size=shape.window,
        page_size=page_size, model_config=model_config, is_draft_worker=False, device=device,
        gpu_id=0, decode_num_tokens_per_req=lambda **_: shape.num_drafts,
        server_args=get_server_args())  # SGLang 0.5.17 reads the runner's
    if model is not None:
        runner.model = model
    try:  # SGLang 0.5.23's id translation; 0.5.17 has none
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    except ImportError:
        runner.kv_index_translator = None
    else:
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=req_to_token_pool.req_to_token, token_to_kv_pool_allocator=allocator,
            token_to_kv_pool=kv_pool, page_size=page_size, device=device)
    return runner


def bind_plan(runner, fb, runner_slots: bool = False) -> None:
    """Bind the batch's KV plan, where this SGLang has plans (0.5.23)."""
    if runner.kv_index_translator is not None:
        if runner_slots:
            runner.kv_index_translator.bind_runner_slots(fb)
        else:
            runner.kv_index_translator.bind_own_plan(fb)


def full_to_swa(runner) -> Optional[torch.Tensor]:
    """Full-pool slot -> sliding-window-pool slot, for an SWAKVPool."""
    return getattr(runner.token_to_kv_pool, "full_to_swa_index_mapping", None)


def pool_slots(runner, layer_id: int, slots: torch.Tensor) -> torch.Tensor:
    """Where ``layer_id`` keeps the K/V of full-pool ``slots``."""
    mapping = getattr(runner.token_to_kv_pool, "layers_mapping", None)
    if mapping is not None and mapping[layer_id][1]:
        return full_to_swa(runner)[slots.long()]
    return slots


def attention_layer(shape: Shape, layer_id: int = 0, **kwargs) -> RadixAttention:
    return RadixAttention(num_heads=shape.num_q_heads, head_dim=shape.head_dim,
                          scaling=shape.head_dim ** -0.5, num_kv_heads=shape.num_kv_heads,
                          layer_id=layer_id, **kwargs)


@dataclass
class DraftTree:
    """EAGLE's draft output for a batch, in the form its tree kernel consumes."""
    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    positions: torch.Tensor = field(default=None)
    retrieve: torch.Tensor = field(default=None)


def draft_tree(shape: Shape, gen: torch.Generator) -> DraftTree:
    """Run EAGLE's top-k selection over random draft logits (peaked, so trees differ),
    on the CPU, and hand the result to ``shape.device`` as the drafter would."""
    scores, score_list, token_list, parents_list = None, [], [], []
    with torch.compiler.set_stance("force_eager"):  # select_top_k_tokens is torch.compile'd
        for step in range(shape.steps):
            rows = shape.bs * (1 if step == 0 else shape.topk)
            probs = torch.softmax(4 * torch.randn(rows, 64, generator=gen), dim=-1)
            topk_p, topk_index = probs.topk(shape.topk, dim=-1)
            _, _, scores, tree_info = select_top_k_tokens(step, topk_p, topk_index, None,
                                                          scores, shape.topk)
            score_list.append(tree_info[0])
            token_list.append(tree_info[1])
            parents_list.append(tree_info[2])
    parent_list, top_scores_index, _ = organize_draft_results(
        score_list, token_list, parents_list, shape.num_drafts)
    return DraftTree(parent_list.to(shape.device), top_scores_index.to(shape.device))


def write_tree_mask(shape: Shape, tree: DraftTree, seq_lens: torch.Tensor, backend) -> torch.Tensor:
    """The drafter's mask for ``backend``, chosen as ``build_eagle_verify_input`` does:
    into the backend's own ``verify_mask`` when it has one that fits, else a fresh
    FULL_MASK; written by SGLang's Triton tree kernel."""
    verify_mask = backend.verify_mask
    if verify_mask is not None and verify_mask.fits(shape.bs):
        mode, mask = verify_mask.mode, verify_mask.buffer
    else:
        mode = TreeMaskMode.FULL_MASK
        numel = shape.num_drafts * (int(seq_lens.sum()) + shape.bs * shape.num_drafts)
        mask = torch.empty(numel, dtype=torch.bool, device=shape.device)
    mask.fill_(True)
    tree.positions = torch.empty(shape.bs * shape.num_drafts, dtype=torch.long,
                                 device=shape.device)
    tree.retrieve = torch.full((3, shape.bs, shape.num_drafts), -1, dtype=torch.long,
                               device=shape.device)
    sgl_build_tree_kernel_triton(
        tree.parent_list, tree.top_scores_index, seq_lens, mask, tree.positions,
        *tree.retrieve, shape.topk, shape.steps, shape.num_drafts, mode)
    return mask


def qlen_only_tree_mask(shape: Shape, tree: DraftTree, seq_lens: torch.Tensor) -> torch.Tensor:
    """The tree as ``[bs, D, D]`` bool (the op's and the reference's layout), written by
    the same kernel into a QLEN_ONLY buffer of its own."""
    own = SimpleNamespace(verify_mask=allocate_verify_mask(shape.bs, shape.num_drafts,
                                                           shape.device))
    flat = write_tree_mask(shape, tree, seq_lens, own)
    return flat[: shape.bs * shape.num_drafts ** 2].view(shape.bs, shape.num_drafts, -1)


def verify_input(shape: Shape, tree: DraftTree, custom_mask: torch.Tensor,
                 seq_lens: torch.Tensor) -> EagleVerifyInput:
    return EagleVerifyInput(
        draft_token=torch.zeros(shape.bs * shape.num_drafts, dtype=torch.long,
                                device=shape.device),
        custom_mask=custom_mask, positions=tree.positions, retrieve_index=tree.retrieve[0],
        retrieve_next_token=tree.retrieve[1], retrieve_next_sibling=tree.retrieve[2],
        retrieve_cum_len=None, spec_steps=shape.steps, topk=shape.topk,
        draft_token_num=shape.num_drafts, capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu())


@dataclass
class VerifyBatch:
    """A batch's layout in the pools: request rows, prefix lengths, draft slots."""
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor


def place_batch(shape: Shape, runner, gen: torch.Generator) -> VerifyBatch:
    """Give each request a row and shuffled slots from SGLang's allocators, and
    fill every layer's K/V pool with random values so a wrong slot shows."""
    rows = alloc_req_rows(runner.req_to_token_pool, shape.bs + 1)[1:]  # rows not 1..bs
    rows = torch.tensor(rows)[torch.randperm(shape.bs, generator=gen)]
    lens = [n + shape.num_drafts for n in shape.prefix_lens]
    page = shape.page_size
    pages = [-(-n // page) for n in lens]
    slots = runner.token_to_kv_pool_allocator.alloc(2 * sum(pages) * page)
    # Fragmented: whole pages shuffled, each request's tokens filling its pages in order.
    page_starts = slots.view(-1, page)[:, 0]
    page_starts = page_starts[torch.randperm(page_starts.numel(), generator=gen).to(slots.device)]
    offsets = torch.arange(page, device=slots.device)
    slots, first = [], 0
    for n, count in zip(lens, pages):
        tokens = (page_starts[first: first + count, None] + offsets[None, :]).flatten()[:n]
        slots.append(tokens)
        first += count
    slots = torch.cat(slots)
    req_to_token, draft_slots, start = runner.req_to_token_pool.req_to_token, [], 0
    for row, prefix, n in zip(rows.tolist(), shape.prefix_lens, lens):
        req_to_token[row, :n] = slots[start: start + n].to(torch.int32)
        draft_slots.append(slots[start + prefix: start + n])
        start += n
    pool = runner.token_to_kv_pool
    for layer_id in range(shape.layer_num):
        for buffer in (pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)):
            fill_random(buffer, gen)
    return VerifyBatch(rows.to(shape.device, torch.int64),
                       torch.tensor(shape.prefix_lens, dtype=torch.int64, device=shape.device),
                       torch.cat(draft_slots).to(torch.int64))


def fill_random(buffer: torch.Tensor, gen: torch.Generator) -> None:
    """Standard normal values drawn where ``buffer`` lives (a CPU draw of a
    long-context pool would take minutes), seeded from ``gen``."""
    seed = int(torch.randint(2 ** 62, (1,), generator=gen))
    draw = torch.Generator(buffer.device).manual_seed(seed)
    if buffer.dtype.is_floating_point and buffer.element_size() == 1:  # fp8: no normal_
        buffer.copy_(torch.empty(buffer.shape, device=buffer.device).normal_(generator=draw))
    else:
        buffer.normal_(generator=draw)


def forward_batch(shape: Shape, runner, batch: VerifyBatch, spec_info) -> ForwardBatch:
    """A TARGET_VERIFY batch bound to its own KV plan, as ForwardBatch.init_new would."""
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=batch.seq_lens.shape[0],
        input_ids=torch.zeros_like(batch.out_cache_loc), req_pool_indices=batch.req_pool_indices,
        seq_lens=batch.seq_lens, out_cache_loc=batch.out_cache_loc,
        seq_lens_sum=int(batch.seq_lens.sum()), seq_lens_cpu=batch.seq_lens.cpu(),
        positions=spec_info.positions, spec_info=spec_info)
    bind_plan(runner, fb)
    return fb


def random_qkv(shape: Shape, gen: torch.Generator):
    """q as a strided view into a fused QKV projection, as models pass it."""
    rows = shape.bs * shape.num_drafts
    q_width = shape.num_q_heads * shape.head_dim
    kv_width = shape.num_kv_heads * shape.head_dim
    qkv = torch.randn(rows, q_width + 2 * kv_width, generator=gen).to(shape.device, shape.dtype)
    q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
    return (q, k.reshape(rows, shape.num_kv_heads, shape.head_dim),
            v.reshape(rows, shape.num_kv_heads, shape.head_dim))


def reference(shape: Shape, runner, batch: VerifyBatch, q: torch.Tensor,
              tree_mask: torch.Tensor, layer_id: int = 0, layer: RadixAttention = None,
              sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The float64 reference over layer ``layer_id``'s pool, ``[bs*D, Hq, d]``, with
    ``layer``'s options (scales of an fp8 pool, soft-cap, window) and ``sinks``;
    call it after a forward stored the drafts' K/V."""
    pool = runner.token_to_kv_pool
    options = {}
    if layer is not None:
        layer_id = layer.layer_id
        if layer.k_scale is not None and shape.cache_dtype != shape.dtype:
            options.update(k_scale=layer.k_scale.reshape(1).float(),
                           v_scale=layer.v_scale.reshape(1).float())
        options.update(logit_cap=float(layer.logit_cap or 0.0),
                       sliding_window=max(-1, layer.sliding_window_size))
    if sinks is not None:
        options["sinks"] = sinks.float()
    req_to_token = pool_slots(runner, layer_id, runner.req_to_token_pool.req_to_token)
    return tree_attn_ref(q.reshape(-1, shape.num_q_heads, shape.head_dim),
                         pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id),
                         req_to_token, batch.req_pool_indices, batch.seq_lens, tree_mask,
                         shape.head_dim ** -0.5, **options)


def build_backends(shape: Shape):
    """SGLang's Triton backend and ours over one set of real pools."""
    runner = stand_in_runner(shape)
    return TritonAttnBackend(runner), VerifyOpsAttnBackend(runner), runner


# -- CUDA-graph capture and replay, as SGLang's decode graph runner does them ------


@dataclass
class GraphInputs:
    """The graph runner's static TARGET_VERIFY inputs (``base_runner``'s buffers),
    ``max_bs`` requests wide: a captured graph reads them by address, so a replay
    copies each batch into them."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    custom_mask: torch.Tensor  # all ones: the mask every graph is captured with
    seq_len_fill_value: int
    encoder_lens: Optional[torch.Tensor] = None  # fields build_replay_fb_view reads
    mamba_track_indices: Optional[torch.Tensor] = None

    @property
    def max_bs(self) -> int:
        return self.seq_lens.shape[0]


def graph_inputs(shape: Shape, max_bs: int, seq_len_fill_value: int) -> GraphInputs:
    """Static inputs as ``base_runner`` allocates them; padded requests have
    ``seq_len_fill_value`` tokens (the backend's ``get_cuda_graph_seq_len_fill_value``)."""
    tokens = max_bs * shape.num_drafts
    index = dict(dtype=torch.int64, device=shape.device)
    return GraphInputs(
        input_ids=torch.zeros(tokens, **index), positions=torch.zeros(tokens, **index),
        out_cache_loc=torch.zeros(tokens, **index), req_pool_indices=torch.zeros(max_bs, **index),
        seq_lens=torch.full((max_bs,), seq_len_fill_value, **index),
        seq_lens_cpu=torch.full((max_bs,), seq_len_fill_value, dtype=torch.int64),
        custom_mask=torch.ones((max_bs * seq_len_fill_value + tokens) * shape.num_drafts,
                               dtype=torch.bool, device=shape.device),
        seq_len_fill_value=seq_len_fill_value)


def capture_batch(shape: Shape, runner, inputs: GraphInputs) -> ForwardBatch:
    """The batch ``capture_prepare`` captures with: the static inputs, the all-ones
    mask, and a spec_info like ``get_spec_info``'s."""
    spec_info = EagleVerifyInput(
        draft_token=None, custom_mask=inputs.custom_mask, positions=None, retrieve_index=None,
        retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
        spec_steps=shape.steps, topk=shape.topk, draft_token_num=shape.num_drafts,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None)
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=inputs.max_bs,
        input_ids=inputs.input_ids, req_pool_indices=inputs.req_pool_indices,
        seq_lens=inputs.seq_lens, seq_lens_cpu=inputs.seq_lens_cpu, orig_seq_lens=inputs.seq_lens,
        out_cache_loc=inputs.out_cache_loc, seq_lens_sum=int(inputs.seq_lens_cpu.sum()),
        positions=inputs.positions, spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.FULL)
    bind_plan(runner, fb, runner_slots=True)
    return fb


def stage_replay(shape: Shape, inputs: GraphInputs, fb: ForwardBatch) -> SimpleNamespace:
    """``replay_prepare`` up to the backend's out-of-graph prep: copy the batch into
    the static inputs, padding as the runner's buffer registry does, and return the
    replay view ``init_forward_metadata_out_graph`` gets."""
    fill = inputs.seq_len_fill_value
    for static, value, pad in (
            (inputs.input_ids, fb.input_ids, 0), (inputs.positions, fb.positions, 0),
            (inputs.out_cache_loc, fb.out_cache_loc, 0),
            (inputs.req_pool_indices, fb.req_pool_indices, 0),
            (inputs.seq_lens, fb.seq_lens, fill), (inputs.seq_lens_cpu, fb.seq_lens_cpu, fill)):
        static[: value.shape[0]].copy_(value)
        static[value.shape[0]:].fill_(pad)
    view_args = dict(
        forward_batch=fb, buffers=inputs, bs=inputs.max_bs, raw_bs=fb.batch_size,
        num_tokens=inputs.max_bs * shape.num_drafts, global_num_tokens_cpu=None,
        seq_len_fill_value=fill, capture_forward_mode=ForwardMode.TARGET_VERIFY,
        is_encoder_decoder=False)
    if "global_num_tokens_cpu" not in inspect.signature(build_replay_fb_view).parameters:
        del view_args["global_num_tokens_cpu"]  # SGLang 0.5.17
    return build_replay_fb_view(**view_args)


# -- one eager TARGET_VERIFY forward, as the model runner drives it -------------


def set_kv_scales(layer: RadixAttention, k_scale: float, v_scale: float) -> None:
    """The layer's KV scales as SGLang's ``BaseKVCacheMethod`` leaves them after loading."""
    layer.k_scale = torch.nn.Parameter(torch.tensor(k_scale), requires_grad=False)
    layer.v_scale = torch.nn.Parameter(torch.tensor(v_scale), requires_grad=False)
    layer.k_scale_float, layer.v_scale_float = k_scale, v_scale


def poison_draft_slots(runner, batch: VerifyBatch, layers) -> None:
    """NaN in the drafts' pool slots of every layer: each backend must store the
    drafts' K/V itself before attending to them."""
    pool = runner.token_to_kv_pool
    for layer in layers:
        slots = pool_slots(runner, layer.layer_id, batch.out_cache_loc)
        for buffer in (pool.get_key_buffer(layer.layer_id),
                       pool.get_value_buffer(layer.layer_id)):
            buffer[slots] = float("nan")


def run_verify(shape: Shape, backend, runner, batch: VerifyBatch, tree: DraftTree, q, k, v,
               layer: RadixAttention, **kwargs):
    """The drafter writes the mask, then one eager TARGET_VERIFY forward into a NaN
    output; returns (output, the mask as written, the ForwardBatch)."""
    mask = write_tree_mask(shape, tree, batch.seq_lens, backend)
    fb = forward_batch(shape, runner, batch, verify_input(shape, tree, mask, batch.seq_lens))
    poison_draft_slots(runner, batch, [layer])
    fb._attn_output = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    backend.init_forward_metadata(fb)
    out = backend.forward(q, k, v, layer, fb, **kwargs)
    assert out.data_ptr() == fb._attn_output.data_ptr()
    return out, mask, fb
