"""verify-ops: tree-attention verify for speculative decoding over SGLang's KV buffers.

``torch.ops.verify.tree_attn`` / ``tree_attn_out`` are registered on import.
"""

from .ops import has_cuda_kernel, tree_attn, tree_attn_out
from .reference import relative_error, tree_attn_ref

__all__ = ["tree_attn", "tree_attn_out", "tree_attn_ref", "relative_error", "has_cuda_kernel"]
