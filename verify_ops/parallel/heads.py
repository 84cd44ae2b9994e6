"""Tensor parallelism: which query and KV heads a rank holds, as SGLang shards them.

SGLang's ``QKVParallelLinear`` gives rank r of ``tp_size`` the query heads
``[r * Hq/tp, (r+1) * Hq/tp)``. KV heads shard the same way while there are
at least ``tp_size`` of them; with fewer, each KV head is replicated on
``tp_size / Hkv`` consecutive ranks and rank r holds the one head
``r * Hkv // tp`` (``ModelConfig.get_num_kv_heads`` keeps ``max(1, Hkv // tp)``
per rank). Either way a rank's query heads use exactly its KV heads, so each
rank runs ``tree_attn`` on its own heads with no communication, and the
outputs concatenate along the head dim.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadShard:
    """One rank's heads: ``q_heads`` and ``kv_heads`` index the global head dims."""
    q_heads: slice
    kv_heads: slice
    kv_replicas: int  # ranks holding each of this rank's KV heads (1: not replicated)


def head_shard(num_q_heads: int, num_kv_heads: int, tp_size: int, tp_rank: int) -> HeadShard:
    """The heads rank ``tp_rank`` of ``tp_size`` holds (SGLang's rule, see module doc).

    Raises ``ValueError`` naming the argument when the heads do not shard:
    ``Hq % tp != 0``, ``Hq % Hkv != 0``, or neither of Hkv and tp divides the other.
    """
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, tp_size = {tp_size}), got {tp_rank}")
    if num_kv_heads < 1 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a positive multiple of "
                         f"num_kv_heads ({num_kv_heads})")
    if num_q_heads % tp_size != 0:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of tp_size "
                         f"({tp_size})")
    q_per_rank = num_q_heads // tp_size
    q_heads = slice(tp_rank * q_per_rank, (tp_rank + 1) * q_per_rank)
    if num_kv_heads >= tp_size:
        if num_kv_heads % tp_size != 0:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) >= tp_size ({tp_size}) must be "
                             "a multiple of it")
        kv_per_rank = num_kv_heads // tp_size
        return HeadShard(q_heads, slice(tp_rank * kv_per_rank, (tp_rank + 1) * kv_per_rank), 1)
    if tp_size % num_kv_heads != 0:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) < tp_size ({tp_size}) must divide it "
                         "(each KV head is replicated on tp_size / num_kv_heads ranks)")
    kv_head = tp_rank * num_kv_heads // tp_size
    return HeadShard(q_heads, slice(kv_head, kv_head + 1), tp_size // num_kv_heads)
