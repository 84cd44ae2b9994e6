"""verify-ops: tree-attention verify for speculative decoding over SGLang's KV buffers.

``torch.ops.verify.tree_attn`` / ``tree_attn_out`` / ``relocate_kv`` are
registered on import.
"""

from .fragmentation import Fragmentation, measure_fragmentation, runs_per_request
from .merge import merge_attn_states
from .ops import has_cuda_kernel, tree_attn, tree_attn_out
from .reference import merge_attn_states_ref, relative_error, tree_attn_ref
from .relocate import relocate_kv

__all__ = ["tree_attn", "tree_attn_out", "tree_attn_ref", "merge_attn_states",
           "merge_attn_states_ref", "relative_error", "has_cuda_kernel", "relocate_kv",
           "Fragmentation", "measure_fragmentation", "runs_per_request"]
