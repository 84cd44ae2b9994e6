"""What a live server must return, computed without SGLang: Hugging Face greedy
continuations of the tiny model, and the verify rounds a chain drafter needs.

Greedy speculative decoding is lossless: whatever the drafts, the output is the
target's greedy continuation. How many verify rounds it takes depends only on
the drafts, so for a chain drafter whose proposals we can compute, the rounds
(and SGLang's ``spec_accept_length`` = completion tokens / rounds) follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

# A drafter: (committed tokens, prompt length) -> its chain of proposals.
Drafter = Callable[[list[int], int], list[int]]


class GreedyModel:
    """The target's next greedy token after any context (memoized).

    ``config_overrides`` change the checkpoint's config on loading, e.g. to
    take a model's sliding window off. Eager attention: the implementation that
    applies Gemma-2's soft-cap and window exactly."""

    def __init__(self, path: Path, **config_overrides):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager", **config_overrides).float().eval()
        self.next_token = lru_cache(maxsize=None)(self._next_token)

    def _next_token(self, context: tuple[int, ...]) -> int:
        with torch.no_grad():
            return int(self.model(torch.tensor([context])).logits[0, -1].argmax())

    def continuation(self, prompt: list[int], new_tokens: int) -> list[int]:
        tokens = list(prompt)
        for _ in range(new_tokens):
            tokens.append(self.next_token(tuple(tokens)))
        return tokens[len(prompt):]


class Fp8KvGreedyModel(GreedyModel):
    """The target as SGLang serves it with ``--kv-cache-dtype fp8_e4m3`` or
    ``fp8_e5m2`` and no KV scales in the checkpoint (scale 1): the pool holds K
    and V rounded to that format. The prefill attends to the prompt's exact
    K/V (Triton's extend kernel takes new tokens' K/V before the pool); every
    later token is scored by TARGET_VERIFY, whose op reads all K/V, its own
    included, from the pool. So the prompt's rows attend to exact K/V and every
    later row to rounded K/V, at every layer."""

    DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}

    def __init__(self, path: Path, kv_cache_dtype: str):
        from transformers import AttentionInterface, AutoModelForCausalLM
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
        from transformers.models.llama.modeling_llama import eager_attention_forward

        pool_dtype = self.DTYPES[kv_cache_dtype]

        def attention(module, query, key, value, attention_mask, prompt_rows, **kwargs):
            exact, _ = eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
            rounded = [t.to(pool_dtype).to(t.dtype) for t in (key, value)]
            out, weights = eager_attention_forward(module, query, *rounded, attention_mask,
                                                   **kwargs)
            out[:, :prompt_rows] = exact[:, :prompt_rows]  # [batch, rows, heads, head_dim]
            return out, weights

        name = f"{kv_cache_dtype}_kv_after_prompt"
        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, eager_mask)  # causal, as eager's
        self.model = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation=name).float().eval()
        self.next_token_after_prompt = lru_cache(maxsize=None)(self._next_token_after_prompt)

    def _next_token_after_prompt(self, context: tuple[int, ...], prompt_len: int) -> int:
        with torch.no_grad():
            logits = self.model(torch.tensor([context]), prompt_rows=prompt_len).logits
        return int(logits[0, -1].argmax())

    def continuation(self, prompt: list[int], new_tokens: int) -> list[int]:
        tokens = list(prompt)
        for _ in range(new_tokens):
            tokens.append(self.next_token_after_prompt(tuple(tokens), len(prompt)))
        return tokens[len(prompt):]


@dataclass(frozen=True)
class Rounds:
    """A request's verify rounds, as SGLang reports them in ``meta_info``."""
    verify_ct: int
    histogram: tuple[int, ...]  # rounds by number of accepted drafts, trailing zeros cut
    completion_tokens: int

    @property
    def accept_length(self) -> float:
        return self.completion_tokens / self.verify_ct

    @staticmethod
    def from_meta(meta: dict) -> "Rounds":
        return Rounds(meta["spec_verify_ct"], trim(meta["spec_correct_drafts_histogram"]),
                      meta["completion_tokens"])


def chain_rounds(target: GreedyModel, drafter: Drafter, prompt: list[int], new_tokens: int,
                 num_steps: int) -> Rounds:
    """SGLang's greedy chain loop: prefill gives the first token; each round the
    drafter proposes ``num_steps`` tokens, the target keeps the longest agreeing
    prefix and adds its own next token."""
    tokens = list(prompt) + [target.next_token(tuple(prompt))]
    histogram = [0] * (num_steps + 1)
    while len(tokens) - len(prompt) < new_tokens:
        accepted = 0
        for draft in drafter(tokens, len(prompt))[:num_steps]:
            if target.next_token(tuple(tokens)) != draft:
                break
            tokens.append(draft)
            accepted += 1
        tokens.append(target.next_token(tuple(tokens)))
        histogram[accepted] += 1
    return Rounds(sum(histogram), trim(histogram), new_tokens)


def standalone_drafter(target: GreedyModel, num_steps: int, *, sees_first_token: bool
                       ) -> Drafter:
    """STANDALONE with the target as its own draft. SGLang 0.5.23 feeds the draft
    EAGLE's shifted inputs (token p+1 at position p: ``_draft_extend_for_prefill``
    drops each prompt's first token, ``_draft_extend_for_decode`` feeds the
    verified next tokens), so its draft sees the context without its first token:
    ``sees_first_token=False``. ``True`` is what a draft fed the plain context would
    propose: the target's own continuation."""
    def propose(tokens: list[int], prompt_len: int) -> list[int]:
        context, drafts = (tokens if sees_first_token else tokens[1:]), []
        for _ in range(num_steps):
            drafts.append(target.next_token(tuple(context + drafts)))
        return drafts
    return propose


def echo_drafter(num_steps: int) -> Drafter:
    """The echo EAGLE head of ``tiny_llama``: it passes the target's hidden state
    through, so every proposal is the target's choice at the root again, which
    is the last committed token."""
    return lambda tokens, prompt_len: [tokens[-1]] * num_steps


def trim(histogram) -> tuple[int, ...]:
    values = list(histogram)
    while values and values[-1] == 0:
        values.pop()
    return tuple(values)
