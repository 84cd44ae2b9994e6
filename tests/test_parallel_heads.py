"""Tensor parallel tree verify: heads sharded as SGLang shards them, each rank runs
the op on its own heads, and the gathered output equals the reference, including
fewer KV heads than ranks (each rank holding a replicated KV head)."""

import pytest
import torch

import verify_ops
from parallel_harness import GROUPS, run_processes
from verify_ops.cases import make_case
from verify_ops.parallel import gather_heads, head_shard, torch_all_gather
from verify_ops.parallel.split_case import split_heads


@pytest.mark.parametrize("hq, hkv, tp, rank, q_heads, kv_heads, replicas", [
    (32, 8, 2, 1, (16, 32), (4, 8), 1),
    (16, 2, 2, 0, (0, 8), (0, 1), 1),      # the 8/1/128 per-rank shape
    (16, 1, 2, 1, (8, 16), (0, 1), 2),     # one KV head, replicated
    (64, 8, 8, 5, (40, 48), (5, 6), 1),    # Llama-3-70B at TP8
    (64, 2, 8, 3, (24, 32), (0, 1), 4),    # ranks 0-3 share KV head 0
    (64, 2, 8, 4, (32, 40), (1, 2), 4),
])
def test_head_shard(hq, hkv, tp, rank, q_heads, kv_heads, replicas):
    shard = head_shard(hq, hkv, tp, rank)
    assert (shard.q_heads.start, shard.q_heads.stop) == q_heads
    assert (shard.kv_heads.start, shard.kv_heads.stop) == kv_heads
    assert shard.kv_replicas == replicas
    # A rank's query heads use exactly its KV heads (global GQA mapping).
    group = hq // hkv
    used = {h // group for h in range(*q_heads)}
    assert used == set(range(*kv_heads))


@pytest.mark.parametrize("args, message", [
    ((12, 4, 8, 0), r"num_q_heads \(12\) must be a multiple of tp_size \(8\)"),
    ((16, 3, 2, 0), r"num_q_heads \(16\) must be a positive multiple of num_kv_heads \(3\)"),
    ((24, 6, 4, 0), r"num_kv_heads \(6\) >= tp_size \(4\) must be a multiple of it"),
    ((24, 4, 6, 0), r"num_kv_heads \(4\) < tp_size \(6\) must divide it"),
    ((16, 2, 2, 2), r"tp_rank must be in \[0, tp_size = 2\), got 2"),
])
def test_head_shard_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        head_shard(*args)


# (Hq, Hkv, d, options): global shapes; at TP2, 16/2 and 16/1 give the 8/1/d
# per-rank shape, the second with its KV head replicated.
CASES = [
    (16, 2, 64, dict()),
    (16, 1, 64, dict(sinks=True)),
    (8, 8, 32, dict(sliding_window=9, logit_cap=4.0)),
]


def check_rank(rank, world_size, device):
    """Every case on this rank's heads, gathered over the group, against the reference."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    all_gather = torch_all_gather()
    for hq, hkv, head_dim, options in CASES:
        if hq % world_size or (hkv < world_size and world_size % hkv):
            continue
        case = make_case([0, 1, 70, 300], 6, hq, hkv, head_dim, dtype=dtype, device=device,
                         strided_q=True, seed=hq + hkv, **options)
        mine = split_heads(case, world_size, rank)
        out, lse = verify_ops.tree_attn(*mine.args(), **mine.options, return_lse=True)
        out = gather_heads(out, all_gather, world_size)
        lse = gather_heads(lse, all_gather, world_size)
        ref, ref_lse = verify_ops.tree_attn_ref(*case.args(), **case.options, return_lse=True)
        name = f"{hq}/{hkv}/{head_dim} {options} rank {rank} of {world_size}"
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert verify_ops.relative_error(out, ref) < tol, name
        finite = ref_lse.isfinite()
        assert torch.equal(finite.cpu(), lse.isfinite().cpu()), name
        assert torch.allclose(lse.double()[finite], ref_lse[finite], atol=2e-3), name


@pytest.mark.parametrize("backend, world_size", GROUPS)
def test_gathered_heads_match_reference(backend, world_size):
    run_processes(check_rank, world_size, backend)
