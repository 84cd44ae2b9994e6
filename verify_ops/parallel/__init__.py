"""Tree verify over several GPUs with ``torch.distributed``.

- Tensor parallel (:mod:`.heads`): each rank holds a slice of the query
  heads and the KV heads they use (replicated when there are fewer KV heads
  than ranks) and runs ``tree_attn`` on them; outputs concatenate by head.
- Context parallel (:mod:`.kv_layout`, :mod:`.context`): each request's
  prefix KV is split over the ranks; each rank returns ``(out, lse)`` for its
  share, and an all-gather plus ``merge_attn_states`` combines them.
  :func:`.context.decode_context_parallel_tree_attn` is SGLang's decode
  context parallelism (query heads sharded, KV heads replicated in the group).

Collectives go through an ``all_gather`` callable (:mod:`.exchange`), so the
same code runs on ``torch.distributed`` groups (NCCL, gloo) and on SGLang's
group coordinators.
"""

from .context import (ContextParallelPlan, combine_shard_states, context_parallel_tree_attn,
                      decode_context_parallel_tree_attn, draft_state, merge_all,
                      plan_context_parallel, shard_state)
from .exchange import AllGather, all_gather_tensors, gather_heads, torch_all_gather
from .heads import HeadShard, head_shard
from .kv_layout import local_positions, local_row_width, owned_count, owner_of

__all__ = ["ContextParallelPlan", "combine_shard_states", "context_parallel_tree_attn",
           "decode_context_parallel_tree_attn", "draft_state", "merge_all",
           "plan_context_parallel", "shard_state", "AllGather", "all_gather_tensors",
           "gather_heads", "torch_all_gather", "HeadShard", "head_shard", "local_positions",
           "local_row_width", "owned_count", "owner_of"]
