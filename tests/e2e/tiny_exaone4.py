"""A tiny random-weight fp32 Exaone 4: a sliding-window layer (with RoPE) and a
full layer (without: Exaone 4's global layers are NoPE), with q/k RMSNorm and
norms after attention and the MLP, written as a Hugging Face checkpoint folder
that SGLang loads into its own ``Exaone4ForCausalLM``.

SGLang serves Exaone 4 with sliding windows only on the attention backends it
lists for it; the plugin adds ``verify_ops`` there. It reads the window
pattern's length (``sliding_window_pattern = "LG"``: every second layer is
global) and gives the window layers ``sliding_window_size = sliding_window - 1``
on a plain (not hybrid SWA) KV pool. Sizes follow ``tiny_llama``; the tokenizer
is the same.
"""

from __future__ import annotations

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

# Keys visible to a query on the window layer: itself and the 7 before it.
SLIDING_WINDOW = 8
# Exaone 4's own theta. SGLang reads ``config.rope_theta`` with 1e6 as its
# default, which transformers 5 (``rope_parameters``) does not set.
ROPE = {"rope_type": "default", "rope_theta": 1_000_000.0}
INIT_STD = 0.1


def build_tiny_exaone4(root: Path, *, seed: int = 0) -> Path:
    """Write the model under ``root / "tiny-exaone4"`` and return that folder."""
    from transformers import Exaone4Config, Exaone4ForCausalLM

    config = Exaone4Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=Q_HEADS, num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM, max_position_embeddings=MAX_POSITIONS,
        sliding_window=SLIDING_WINDOW, sliding_window_pattern="LG",
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters=ROPE, initializer_range=INIT_STD, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, dtype="float32")
    return write_hf_model(root / "tiny-exaone4", Exaone4ForCausalLM, config, seed=seed)
