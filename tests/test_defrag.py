"""The defrag hooks on SGLang's real allocator, KV pool and request-table classes.

- churn: runs per request for stock SGLang, ``need_sort`` and ours;
- relocation: attention output bitwise identical before and after, no slot
  owned twice, free + owned == pool, consistent after an injected failure,
  radix-shared slots never moved;
- the allocation policy and its SGLang call-site plans;
- the hooks, applied by SGLang's own plugin loader in a fresh process.
"""

import logging
import os
import subprocess
import sys
import textwrap
from array import array
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

# sglang may import while its deeper modules lack dependencies: skip on what is used.
for _module in ("sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.memory_pool"):
    pytest.importorskip(_module)

import torch  # noqa: E402
from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402

import verify_ops  # noqa: E402
from verify_ops.cases import make_tree_masks  # noqa: E402
from bench.churn import ChurnConfig, ChurnSimulation  # noqa: E402
from verify_ops.sglang import (  # noqa: E402
    allocator_hooks,
    config,
    defrag,
    fragmentation_log,
    live_relocation,
    relocation,
)
from verify_ops.sglang.compat import alloc_req_rows  # noqa: E402
from verify_ops.sglang.contiguous_alloc import attach, unsupported_reason  # noqa: E402
from verify_ops.sglang.relocation import OwnedSpan, relocate_fragmented  # noqa: E402

NUM_DRAFTS, HQ, HKV, HEAD_DIM = 4, 4, 2, 64
POLICY_OFF = unsupported_reason()  # SGLang 0.5.17: the policy stays off, Tier 0 alone
needs_policy = pytest.mark.skipif(
    POLICY_OFF is not None, reason=f"contiguity-aware allocation is off here: {POLICY_OFF}")
POOL_TOKENS = 1024


def runs_of(slots: torch.Tensor) -> int:
    return 1 + int((slots[1:] != slots[:-1] + 1).sum()) if slots.numel() else 0


# -- a fragmented batch on real SGLang pools ---------------------------------

@dataclass
class Scene:
    allocator: object
    kv_pool: MHATokenToKVPool
    req_to_token_pool: ReqToTokenPool
    rows: list
    allocated: list
    seq_lens: list
    q: list
    tree_mask: torch.Tensor

    @property
    def req_to_token(self):
        return self.req_to_token_pool.req_to_token

    @property
    def page_size(self):
        return self.allocator.page_size

    def spans(self):
        return [OwnedSpan(row, 0, end) for row, end in zip(self.rows, self.allocated)]

    def row_slots(self, i):
        return self.req_to_token[self.rows[i], : self.allocated[i]].long()

    def outputs(self):
        """verify.tree_attn of every layer, every request."""
        device = self.req_to_token.device
        rows = torch.tensor(self.rows, device=device)
        lens = torch.tensor(self.seq_lens, device=device)
        return [verify_ops.tree_attn(q, self.kv_pool.get_key_buffer(layer),
                                     self.kv_pool.get_value_buffer(layer), self.req_to_token,
                                     rows, lens, self.tree_mask, HEAD_DIM ** -0.5)
                for layer, q in enumerate(self.q)]

    def check_accounting(self):
        """No page owned twice; free + owned == pool; nothing both free and owned."""
        ps = self.page_size
        owned = torch.cat([(self.row_slots(i) // ps).unique() for i in range(len(self.rows))])
        free = self.allocator.get_all_free_pages().cpu()
        assert owned.unique().numel() == owned.numel(), "a page is owned twice"
        assert free.unique().numel() == free.numel(), "a page is free twice"
        assert not torch.isin(owned.cpu(), free).any(), "a page is both owned and free"
        assert owned.numel() + free.numel() == POOL_TOKENS // ps
        assert self.allocator.available_size() == free.numel() * ps


def fragmented_scene(device, page_size=1, prefix_lens=(37, 0, 90, 5, 61), num_layers=3,
                     seed=0) -> Scene:
    """Requests grown round-robin in small unplanned pieces, so their slots interleave."""
    gen = torch.Generator().manual_seed(seed)
    kv_pool = MHATokenToKVPool(size=POOL_TOKENS, page_size=page_size, dtype=torch.bfloat16,
                               head_num=HKV, head_dim=HEAD_DIM, layer_num=num_layers,
                               device=device, enable_memory_saver=False, enable_alt_stream=False)
    if page_size == 1:
        allocator = TokenToKVPoolAllocator(POOL_TOKENS, torch.bfloat16, device, kv_pool, True)
    else:
        allocator = PagedTokenToKVPoolAllocator(POOL_TOKENS, page_size, torch.bfloat16, device,
                                                kv_pool, True)
    attach(allocator)
    rtp = ReqToTokenPool(size=len(prefix_lens) + 2, max_context_len=256, device=device,
                         enable_memory_saver=False)
    rows = alloc_req_rows(rtp, len(prefix_lens))
    targets = [-(-(n + NUM_DRAFTS + 3) // page_size) * page_size for n in prefix_lens]
    allocated = [0] * len(rows)
    while any(a < t for a, t in zip(allocated, targets)):
        for i, row in enumerate(rows):
            step = min(page_size * int(torch.randint(1, 4, (), generator=gen)),
                       targets[i] - allocated[i])
            if step:
                slots = allocator.alloc(step)
                rtp.req_to_token[row, allocated[i]: allocated[i] + step] = slots.to(torch.int32)
                allocated[i] += step
    for buffer in (*kv_pool.k_buffer, *kv_pool.v_buffer):
        buffer.copy_(torch.randn(buffer.shape, generator=gen))
    bs = len(rows)
    q = [torch.randn(bs * NUM_DRAFTS, HQ, HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
         for _ in range(num_layers)]
    tree_mask = make_tree_masks(bs, NUM_DRAFTS, "random", gen).to(device)
    return Scene(allocator, kv_pool, rtp, rows, allocated, list(prefix_lens), q, tree_mask)


def kv_caches(scene):
    return [(scene.kv_pool.k_buffer, scene.kv_pool.v_buffer)]


# -- relocation invariants ---------------------------------------------------

@needs_policy
@pytest.mark.parametrize("page_size", [1, 16])
def test_relocation_is_lossless(device, page_size):
    scene = fragmented_scene(device, page_size)
    before = scene.outputs()
    old_slots = [scene.row_slots(i) for i in range(len(scene.rows))]
    runs_before = [runs_of(s) for s in old_slots]
    scene.check_accounting()

    moved = relocate_fragmented(scene.allocator, scene.req_to_token, kv_caches(scene),
                                scene.spans(), max_requests=3)

    most_fragmented = sorted((r for r in runs_before if r > 1), reverse=True)[:3]
    assert len(most_fragmented) >= 2
    assert list(moved.runs_before) == most_fragmented
    runs_after = [runs_of(scene.row_slots(i)) for i in range(len(scene.rows))]
    assert runs_after.count(1) == runs_before.count(1) + len(most_fragmented)
    for after, want in zip(scene.outputs(), before):
        assert torch.equal(after, want)  # bitwise: same values, same order of arithmetic
    scene.check_accounting()
    freed = scene.allocator.get_all_free_pages().cpu()
    for i, old in enumerate(old_slots):
        if runs_after[i] == 1 and runs_before[i] > 1:  # moved: its old pages are free again
            assert torch.isin((old // page_size).cpu(), freed).all()


@needs_policy
@pytest.mark.parametrize("failure", ["copy", "table rewrite", "free"])
def test_interrupted_relocation_keeps_a_consistent_state(device, monkeypatch, failure):
    scene = fragmented_scene(device)
    before = scene.outputs()
    table = scene.req_to_token.clone()

    def copy_one_layer_then_fail(k_caches, v_caches, src, dst):
        verify_ops.relocate_kv(k_caches[:1], v_caches[:1], src, dst)
        raise RuntimeError("injected failure")

    real_rewrite = relocation._rewrite_rows
    calls = []

    def rewrite_first_span_then_fail(req_to_token, spans, slots):
        calls.append(spans)
        if len(calls) == 1:
            real_rewrite(req_to_token, spans[:1], slots[: spans[0].end - spans[0].start])
            raise RuntimeError("injected failure")
        real_rewrite(req_to_token, spans, slots)

    def free_fails(slots):
        raise RuntimeError("injected failure")

    if failure == "copy":
        monkeypatch.setattr(relocation, "relocate_kv", copy_one_layer_then_fail)
    elif failure == "table rewrite":
        monkeypatch.setattr(relocation, "_rewrite_rows", rewrite_first_span_then_fail)
    else:  # the last step: the old slots go back to the allocator
        monkeypatch.setattr(scene.allocator, "free", free_fails)
    with pytest.raises(RuntimeError, match="injected failure"):
        relocate_fragmented(scene.allocator, scene.req_to_token, kv_caches(scene),
                            scene.spans(), max_requests=3)

    assert torch.equal(scene.req_to_token, table)
    for after, want in zip(scene.outputs(), before):
        assert torch.equal(after, want)
    scene.check_accounting()

    monkeypatch.undo()  # the allocator is still usable: the next relocation succeeds
    assert relocate_fragmented(scene.allocator, scene.req_to_token, kv_caches(scene),
                               scene.spans(), max_requests=3).moved_requests >= 2
    for after, want in zip(scene.outputs(), before):
        assert torch.equal(after, want)
    scene.check_accounting()


@needs_policy
def test_live_relocation_moves_the_draft_models_kv_too():
    """Under EAGLE the scheduler's ``draft_worker`` is SGLang's spec worker
    (EAGLEWorkerV2), whose draft runners sit on its inner draft worker; their
    KV pool uses the same slots, so it moves with the target's."""
    pytest.importorskip("sglang.srt.speculative.eagle_worker_v2")
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    scene = fragmented_scene("cpu")
    draft_pool = MHATokenToKVPool(size=POOL_TOKENS, page_size=1, dtype=torch.bfloat16,
                                  head_num=HKV, head_dim=HEAD_DIM, layer_num=1, device="cpu",
                                  enable_memory_saver=False, enable_alt_stream=False)
    gen = torch.Generator().manual_seed(5)
    for buffer in (*draft_pool.k_buffer, *draft_pool.v_buffer):
        buffer.copy_(torch.randn(buffer.shape, generator=gen))
    target = SimpleNamespace(token_to_kv_pool=scene.kv_pool,
                             spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"))
    spec_worker = EAGLEWorkerV2.__new__(EAGLEWorkerV2)  # only what relocation reads
    spec_worker._target_worker = SimpleNamespace(model_runner=target)
    spec_worker._draft_worker = SimpleNamespace(
        draft_runners=[SimpleNamespace(token_to_kv_pool=draft_pool)])
    scheduler = SimpleNamespace(tp_worker=SimpleNamespace(model_runner=target),
                                draft_worker=spec_worker,
                                token_to_kv_pool_allocator=scene.allocator,
                                req_to_token_pool=scene.req_to_token_pool)

    def draft_kv():  # each request's draft K and V, read through req_to_token
        return [b[scene.row_slots(i)].clone() for i in range(len(scene.rows))
                for b in (*draft_pool.k_buffer, *draft_pool.v_buffer)]

    before, draft_before = scene.outputs(), draft_kv()
    runs_before = [runs_of(scene.row_slots(i)) for i in range(len(scene.rows))]
    reqs = [SimpleNamespace(kv=ReqKvInfo(req_pool_idx=row, cache_protected_len=0,
                                         kv_allocated_len=end))
            for row, end in zip(scene.rows, scene.allocated)]
    relocator = live_relocation.LiveRelocation()
    relocator.steps = live_relocation.RELOCATE_EVERY_STEPS - 1  # the next step relocates
    relocator.step(scheduler, SimpleNamespace(reqs=reqs))

    assert relocator.enabled
    runs_after = [runs_of(scene.row_slots(i)) for i in range(len(scene.rows))]
    assert runs_after.count(1) > runs_before.count(1), "nothing was moved"
    for after, want in zip(scene.outputs(), before):
        assert torch.equal(after, want)
    for after, want in zip(draft_kv(), draft_before):
        assert torch.equal(after, want)
    scene.check_accounting()


@needs_policy
def test_live_relocation_stays_off_where_the_drafters_pools_are_unknown():
    scene = fragmented_scene("cpu")
    scheduler = SimpleNamespace(tp_worker=SimpleNamespace(
                                    model_runner=SimpleNamespace(token_to_kv_pool=scene.kv_pool)),
                                draft_worker=SimpleNamespace())  # no runners to be found
    assert live_relocation.kv_caches(scheduler) is None


@needs_policy
def test_radix_shared_slots_are_never_moved():
    pytest.importorskip("sglang.srt.mem_cache.radix_cache")
    pytest.importorskip("sglang.srt.managers.schedule_batch")
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    scene = fragmented_scene("cpu", prefix_lens=(40, 40))
    prefix = 20
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=scene.req_to_token_pool,
                                      token_to_kv_pool_allocator=scene.allocator, page_size=1))
    # Request 0's first 20 tokens go into the tree; request 1 matches them and shares the
    # slots, then frees its own duplicates, as a radix-cache hit does.
    tokens = array("q", range(1000, 1000 + prefix))
    tree.insert(InsertParams(key=RadixKey(tokens), value=scene.row_slots(0)[:prefix].clone()))
    node = tree.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node
    tree.inc_lock_ref(node)
    shared = tree.path_device_indices(node).clone()
    scene.allocator.free(scene.row_slots(1)[:prefix].clone())
    scene.req_to_token[scene.rows[1], :prefix] = shared.to(torch.int32)
    reqs = [SimpleNamespace(kv=ReqKvInfo(req_pool_idx=row, cache_protected_len=prefix,
                                         kv_allocated_len=end))
            for row, end in zip(scene.rows, scene.allocated)]
    before = scene.outputs()
    shared_kv = [b[shared].clone() for b in (*scene.kv_pool.k_buffer, *scene.kv_pool.v_buffer)]

    spans = relocation.owned_spans(reqs)
    assert [(s.start, s.end) for s in spans] == [(prefix, end) for end in scene.allocated]
    # Spans that ignore the radix marking share slots: neither is moved nor copied.
    overlapping = [OwnedSpan(s.row, 0, s.end) for s in spans]
    assert relocate_fragmented(scene.allocator, scene.req_to_token, kv_caches(scene),
                               overlapping).moved_requests == 0
    assert relocate_fragmented(scene.allocator, scene.req_to_token, kv_caches(scene),
                               spans).moved_requests == 2

    for row in scene.rows:
        assert torch.equal(scene.req_to_token[row, :prefix].long(), shared)
    assert torch.equal(tree.path_device_indices(node), shared)
    for buffer, kv in zip((*scene.kv_pool.k_buffer, *scene.kv_pool.v_buffer), shared_kv):
        assert torch.equal(buffer[shared], kv)
    assert not torch.isin(shared, scene.allocator.get_all_free_pages()).any()
    for after, want in zip(scene.outputs(), before):
        assert torch.equal(after, want)


# -- churn ---------------------------------------------------------------------

@needs_policy
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mode", ["spec", "decode"])
def test_churn_runs_per_request(mode, page_size):
    results = {}
    for name, policy, relocate_every in (("stock", "stock", 0), ("need_sort", "need_sort", 0),
                                         ("ours", "ours", 0), ("ours+relocate", "ours", 8)):
        sim = ChurnSimulation(ChurnConfig(policy=policy, mode=mode, page_size=page_size,
                                          relocate_every=relocate_every))
        results[name] = sim.run()
    print(f"\nchurn {mode} page_size={page_size}: runs per request mean / p99")
    for name, r in results.items():
        print(f"  {name:14} {r.runs.mean_runs:7.2f} / {r.runs.p99_runs:4.0f}   finished "
              f"{r.finished}, retracted {r.retracted}, relocated {r.relocated_requests}")
    assert results["ours"].runs.mean_runs < results["stock"].runs.mean_runs
    assert results["ours"].runs.mean_runs < results["need_sort"].runs.mean_runs
    assert results["ours+relocate"].relocated_requests > 0
    check_churn_state(sim)


def check_churn_state(sim):
    """After churn with relocation: ownership adds up and every KV stamp is where
    the request's row says."""
    ps = sim.config.page_size
    owned = [(sim.req_to_token[r.row, : r.allocated].long() // ps).unique() for r in sim.running]
    owned = torch.cat(owned) if owned else torch.zeros(0, dtype=torch.int64)
    free = sim.allocator.get_all_free_pages()
    assert owned.unique().numel() == owned.numel()
    assert not torch.isin(owned, free).any()
    assert owned.numel() + free.numel() == sim.config.pool_tokens // ps
    for r in sim.running:
        slots = sim.req_to_token[r.row, : r.allocated].long()
        stamps = sim.stamp(r.uid, torch.arange(r.allocated))
        assert torch.equal(sim.k_stamps[slots, 0], stamps)
        assert torch.equal(sim.v_stamps[slots, 0], -stamps)


# -- the allocation policy -------------------------------------------------------

def token_allocator(size=64):
    allocator = TokenToKVPoolAllocator(size, torch.bfloat16, "cpu", None, True)
    return allocator, attach(allocator)


@needs_policy
def test_token_policy_extends_in_place_and_reuses_holes_whole():
    allocator, policy = token_allocator()
    with policy.growing([1, 2], [0, 0], [4, 4]):
        first = allocator.alloc(8).tolist()
    assert first[:4] == [1, 2, 3, 4]
    assert first[4] > 5  # placed with room after request 1's tail
    with policy.growing([1, 2], [4, 4], [2, 2]):
        grown = allocator.alloc(4).tolist()
    assert grown == [5, 6, first[7] + 1, first[7] + 2]  # both right after their tails
    allocator.free(torch.tensor(first[:4] + grown[:2]))  # request 1 finishes
    assert allocator.available_size() == 64 - 6 - 6 + 6
    pieces = allocator.alloc(50)  # short of one run: the freed hole comes back whole
    assert pieces is not None and set(range(1, 7)) <= set(pieces.tolist())
    assert allocator.alloc(64) is None  # short: nothing taken
    assert allocator.available_size() == 64 - 56


@needs_policy
def test_token_policy_clear_and_census():
    allocator, policy = token_allocator()
    allocator.alloc(10)
    allocator.free(torch.tensor([3, 4]))
    assert sorted(allocator.get_all_free_pages().tolist()) == [3, 4] + list(range(11, 65))
    allocator.clear()
    assert allocator.available_size() == 64 and not policy.tails


@needs_policy
def test_paged_policy_keeps_sglang_index_contract():
    allocator = PagedTokenToKVPoolAllocator(256, 4, torch.bfloat16, "cpu", None, True)
    attach(allocator)
    prefix = torch.tensor([0, 0])
    seq = torch.tensor([6, 3])
    out = allocator.alloc_extend(prefix, prefix, seq, seq, torch.tensor([-1, -1]), 9)
    a, b = out[:6].tolist(), out[6:].tolist()
    assert a == list(range(a[0], a[0] + 6)) and a[0] % 4 == 0  # pages back to back
    assert b == list(range(b[0], b[0] + 3)) and b[0] % 4 == 0
    # Grow request a by 3 (fills its page, then the page right after) and b by 1 (same page).
    prefix, seq = torch.tensor([6, 3]), torch.tensor([9, 4])
    out = allocator.alloc_extend(prefix, prefix, seq, seq, torch.tensor([a[-1], b[-1]]), 4)
    assert out.tolist() == [a[-1] + 1, a[-1] + 2, a[-1] + 3, b[-1] + 1]
    out = allocator.alloc_decode(torch.tensor([10, 5]), torch.tensor([10, 5]),
                                 torch.tensor([a[-1] + 3, b[-1] + 1]))
    assert out[0] == a[-1] + 4 and out[1] % 4 == 0 and out[1] != out[0]
    assert allocator.available_size() == 256 - 4 * 5


@needs_policy
def test_sglang_call_site_plans_keep_requests_contiguous():
    """defrag's hooks around SGLang's allocation helpers, with stand-ins for the
    helpers that do what SGLang's do at page size 1: one alloc, split in request order."""
    allocator, _ = token_allocator(size=256)
    rtp = ReqToTokenPool(size=4, max_context_len=128, device="cpu", enable_memory_saver=False)
    table = rtp.req_to_token
    reqs = [SimpleNamespace(kv=SimpleNamespace(req_pool_idx=None, kv_allocated_len=0))
            for _ in range(3)]

    def write(slots, reqs, starts, counts):
        offset = 0
        for req, start, count in zip(reqs, starts, counts):
            table[req.kv.req_pool_idx, start: start + count] = slots[offset: offset + count].int()
            req.kv.kv_allocated_len = start + count
            offset += count

    def alloc_for_extend(batch):  # rows are assigned inside, before the slots
        for req, row in zip(batch.reqs, alloc_req_rows(rtp, len(batch.reqs))):
            req.kv.req_pool_idx = row
        write(allocator.alloc(sum(batch.extend_lens)), batch.reqs, batch.prefix_lens,
              batch.extend_lens)

    def alloc_for_decode_default(batch, token_per_req):
        write(allocator.alloc(len(batch.reqs) * token_per_req), batch.reqs,
              [r.kv.kv_allocated_len for r in batch.reqs], [token_per_req] * len(batch.reqs))

    def alloc_for_spec_decode(tree_cache, req_to_token_pool, *, reqs, cur_kv_lens_cpu,
                              nxt_kv_lens_cpu, num_needed_tokens, **_):
        counts = (nxt_kv_lens_cpu - cur_kv_lens_cpu).tolist()
        write(tree_cache.token_to_kv_pool_allocator.alloc(num_needed_tokens), reqs,
              cur_kv_lens_cpu.tolist(), counts)

    batch = SimpleNamespace(token_to_kv_pool_allocator=allocator, reqs=reqs,
                            prefix_lens=[0, 0, 0], extend_lens=[5, 9, 2])
    allocator_hooks.plan_extend(alloc_for_extend, batch)
    for _ in range(4):
        allocator_hooks.plan_decode(alloc_for_decode_default, batch, 1)
        cur = torch.tensor([r.kv.kv_allocated_len for r in reqs])
        allocator_hooks.plan_spec_decode(alloc_for_spec_decode, SimpleNamespace(
            token_to_kv_pool_allocator=allocator), rtp, reqs=reqs, req_pool_indices=None,
            cur_kv_lens=None, cur_kv_lens_cpu=cur, nxt_kv_lens=None, nxt_kv_lens_cpu=cur + 3,
            num_needed_tokens=9)
    for req in reqs:
        assert runs_of(table[req.kv.req_pool_idx, : req.kv.kv_allocated_len].long()) == 1


# -- the metric log and the hooks --------------------------------------------------

def test_fragmentation_log_every_n_steps_without_padding():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(fragmentation_log.__name__)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)  # not `.level =`: setLevel clears isEnabledFor's cache
    try:
        log = fragmentation_log.FragmentationLog(every=2)
        table = torch.tensor([[1, 2, 3, 0], [7, 5, 3, 1], [0, 0, 0, 0]])
        batch = SimpleNamespace(req_pool_indices=torch.tensor([0, 1, 2]),
                                seq_lens=torch.tensor([3, 4, 1]), num_padding=1)
        log.observe(table, batch)
        assert not records
        log.observe(table, batch)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    (record,) = records
    assert record.levelno == logging.INFO
    assert "mean 2.50 p99 4 over 2 requests" in record.getMessage()


def test_defrag_level_from_env(monkeypatch):
    monkeypatch.delenv(config.DEFRAG_ENV_VAR, raising=False)
    assert config.defrag_level() == config.DEFRAG_ALLOCATOR
    monkeypatch.setenv(config.DEFRAG_ENV_VAR, "0")
    assert config.defrag_level() == config.DEFRAG_OFF
    monkeypatch.setenv(config.DEFRAG_ENV_VAR, "yes")
    with pytest.raises(ValueError, match="VERIFY_OPS_DEFRAG must be 0 .* got 'yes'"):
        config.defrag_level()


HOOKS_SCRIPT = textwrap.dedent("""
    import os, torch
    os.environ.pop("SGLANG_PLUGINS", None)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    load_plugins()
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.runtime_context import get_context
    from verify_ops.sglang.contiguous_alloc import state_of, unsupported_reason

    def build(backend):
        with get_context().override_server_args(attention_backend=backend):
            return (TokenToKVPoolAllocator(64, torch.bfloat16, "cpu", None, False),
                    PagedTokenToKVPoolAllocator(64, 4, torch.bfloat16, "cpu", None,
                                                need_sort=False))

    level = os.environ.get("VERIFY_OPS_DEFRAG", "1")
    policy = unsupported_reason() is None
    hooked = [a for a in build("verify_ops") if a.need_sort and (state_of(a) is not None) == policy]
    stock = [a for a in build("triton") if not a.need_sort and state_of(a) is None]
    patched = sorted(t.rsplit(".", 2)[-2] + "." + t.rsplit(".", 1)[-1]
                     for t, hooks in HookRegistry._hooks.items() if t in HookRegistry._patched
                     and any(src and src.plugin_name == "verify_ops" for _, _, src in hooks))
    print(level, len(hooked), len(stock), patched)
""")


OUR_TARGETS = ["PagedTokenToKVPoolAllocator.__init__", "TokenToKVPoolAllocator.__init__"] + (
    ["allocation.alloc_for_decode_default", "allocation.alloc_for_extend",
     "allocation.alloc_for_spec_decode"] if POLICY_OFF is None else [])


@pytest.mark.parametrize("level,targets", [
    ("0", []), ("1", OUR_TARGETS),
    ("2", sorted(OUR_TARGETS + ["Scheduler.get_next_batch_to_run"]))])
def test_install_registers_the_hooks_of_each_level(monkeypatch, level, targets):
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    from sglang.srt.plugins.hook_registry import HookRegistry

    registered = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(
        lambda cls, target, hook, hook_type: registered.append(target)))
    monkeypatch.setattr(defrag, "_installed", False)
    monkeypatch.setenv(config.DEFRAG_ENV_VAR, level)
    defrag.install()
    defrag.install()  # idempotent
    assert sorted(t.rsplit(".", 2)[-2] + "." + t.rsplit(".", 1)[-1] for t in registered) == targets


def test_sglang_plugin_loader_applies_the_hooks():
    """A fresh process, as each SGLang process: load_plugins() resolves and applies every
    target; the allocators are hooked only where verify_ops is the configured backend."""
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    # The scheduler imports server-only packages (missing on the H200 box), and the
    # hook registry skips a target it cannot import.
    pytest.importorskip("sglang.srt.managers.scheduler")
    child = subprocess.run([sys.executable, "-c", HOOKS_SCRIPT], capture_output=True,
                           text=True, timeout=300, env={**os.environ, config.DEFRAG_ENV_VAR: "2"})
    assert child.returncode == 0, child.stderr[-5000:]
    expected = sorted(OUR_TARGETS + ["Scheduler.get_next_batch_to_run"])
    assert child.stdout.strip().splitlines()[-1] == f"2 2 2 {expected}", child.stderr[-5000:]
