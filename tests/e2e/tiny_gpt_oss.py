"""A tiny random-weight fp32 gpt-oss: a sliding-window layer and a full layer,
each with attention sinks, head_dim 64 and a 4-expert MoE, written as a Hugging
Face checkpoint folder that SGLang loads into its own ``GptOssForCausalLM``.

SGLang serves gpt-oss only on the attention backends it lists for it; the
plugin adds ``verify_ops`` there. It keeps the window layers on its hybrid SWA
pool. On the CPU the server needs ``--moe-runner-backend triton``: the backend
SGLang picks for gpt-oss by default (triton_kernels) lays the expert weights
out for its GPU kernels, which SGLang's CPU MoE then cannot multiply. Sizes
follow ``tiny_llama``; the tokenizer is the same.
"""

from __future__ import annotations

from pathlib import Path

from tiny_llama import HIDDEN, KV_HEADS, LAYERS, MAX_POSITIONS, Q_HEADS, VOCAB, write_hf_model

HEAD_DIM = 64  # gpt-oss's own
# Keys visible to a query on the window layer: itself and the 7 before it.
SLIDING_WINDOW = 8
EXPERTS, EXPERTS_PER_TOKEN, EXPERT_INTERMEDIATE = 4, 2, 64
# YaRN as gpt-oss has it, its context stretched 32x to MAX_POSITIONS.
ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
        "original_max_position_embeddings": MAX_POSITIONS // 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
# Weights of about 0.1 (transformers' default 0.02 leaves every layer near the
# identity); sinks of about 1, against scores of about 0.1-1, so they weigh.
INIT_STD, SINK_STD = 0.1, 1.0
SERVER_ARGS = ("--moe-runner-backend", "triton")


def draw_weights(model) -> None:
    for name, param in model.named_parameters():
        if "norm" not in name:
            param.normal_(0, SINK_STD if name.endswith("sinks") else INIT_STD)


def build_tiny_gpt_oss(root: Path, *, seed: int = 0) -> Path:
    """Write the model under ``root / "tiny-gpt-oss"`` and return that folder."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=Q_HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        num_local_experts=EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN,
        intermediate_size=EXPERT_INTERMEDIATE, sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=MAX_POSITIONS, rope_parameters=ROPE,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        dtype="float32")
    return write_hf_model(root / "tiny-gpt-oss", GptOssForCausalLM, config, seed=seed,
                          init=draw_weights)
