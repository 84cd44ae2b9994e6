"""A pure-PyTorch stand-in for ``vllm._custom_ops.rotary_embedding``, the one
vLLM function SGLang's ``RotaryEmbedding`` imports on a plain CPU."""

from __future__ import annotations

import torch


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotate ``query`` and ``key`` in place, as vLLM's kernel does.

    positions: ``[num_tokens]`` int; query / key: ``[num_tokens, heads * head_size]``
    or ``[num_tokens, heads, head_size]``; cos_sin_cache: ``[max_position,
    rotary_dim]``, cos in the first half of the last dim, sin in the second.
    Only the first ``rotary_dim`` features of each head turn. ``is_neox``: the
    pairs are (i, i + rotary_dim / 2), else (2i, 2i + 1) (GPT-J).
    """
    cos, sin = cos_sin_cache.index_select(0, positions.flatten().long()).chunk(2, dim=-1)
    for x in (query, key):
        if x is not None:
            _rotate(x, cos, sin, head_size, is_neox)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int,
            is_neox: bool) -> None:
    rotary_dim = 2 * cos.shape[-1]
    heads = x.view(x.shape[0], -1, head_size)[..., :rotary_dim]
    cos, sin = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    if is_neox:
        first, second = heads[..., : rotary_dim // 2], heads[..., rotary_dim // 2:]
    else:
        first, second = heads[..., 0::2], heads[..., 1::2]
    a, b = first.clone(), second.clone()
    first.copy_(a * cos - b * sin)
    second.copy_(b * cos + a * sin)
