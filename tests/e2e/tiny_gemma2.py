"""A tiny random-weight fp32 Gemma-2 with a sliding window and an attention
logit soft-cap, written as a Hugging Face checkpoint folder that SGLang loads.

Gemma-2 is a model whose windows SGLang 0.5.23 applies (its Llama, Mistral and
Qwen2 ignore ``sliding_window``): layer 0 (the even layers) gets
``sliding_window_size = sliding_window - 1``, and every layer the
``attn_logit_softcapping`` as ``logit_cap``. SGLang keeps Gemma-2 on a plain
(not hybrid SWA) KV pool. Sizes follow ``tiny_llama``; the tokenizer is the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_llama import (
    HEAD_DIM,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    MAX_POSITIONS,
    Q_HEADS,
    VOCAB,
    write_hf_model,
)

# Keys visible to a query: itself and the 7 before it. The prompts and the
# generated tokens together run past it within a few tokens.
SLIDING_WINDOW = 8
# Scores of the random model are about 0.1-1: a cap of 1 bends them visibly.
ATTN_LOGIT_SOFTCAP = 1.0
# Gemma-2 scales the tied embedding by sqrt(hidden), so the token's own
# embedding dominates the logits and every output repeats the last token. Its
# post-attention and post-MLP norms (weights w, scaling by 1 + w) scaled up make
# the layers, and with them the window and the cap, decide the next token.
POST_NORM_WEIGHT = 4.0
INIT_STD = 0.1


def scale_post_norms(model) -> None:
    for layer in model.model.layers:
        layer.post_attention_layernorm.weight.fill_(POST_NORM_WEIGHT)
        layer.post_feedforward_layernorm.weight.fill_(POST_NORM_WEIGHT)


def build_tiny_gemma2(root: Path, *, seed: int = 0) -> Path:
    """Write the model under ``root / "tiny-gemma2"`` and return that folder."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=Q_HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM, max_position_embeddings=MAX_POSITIONS,
        sliding_window=SLIDING_WINDOW, attn_logit_softcapping=ATTN_LOGIT_SOFTCAP,
        final_logit_softcapping=None, initializer_range=INIT_STD,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, dtype="float32")
    folder = write_hf_model(root / "tiny-gemma2", Gemma2ForCausalLM, config, seed=seed,
                            init=scale_post_norms)
    # SGLang's Gemma-2 reads ``hidden_act``; transformers 5 writes only ``hidden_activation``.
    config_path = folder / "config.json"
    written = json.loads(config_path.read_text())
    written["hidden_act"] = written["hidden_activation"]
    config_path.write_text(json.dumps(written, indent=1))
    return folder
