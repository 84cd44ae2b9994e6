"""A tiny random-weight fp32 Llama, its EAGLE draft head and a byte-level BPE
tokenizer, written as Hugging Face checkpoint folders that SGLang loads.

Everything is built locally (no network): the tokenizer is trained with the
``tokenizers`` library on the source text of a few standard-library modules,
the weights are drawn from a seeded generator. Sizes follow issue 43: hidden
256, 2 layers, 4 query heads, 2 KV heads, head_dim 64, vocab 1024.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

HIDDEN = 256
INTERMEDIATE = 512
LAYERS = 2
Q_HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
VOCAB = 1024
MAX_POSITIONS = 2048
SPECIAL_TOKENS = ("<s>", "</s>")  # ids 0 and 1: bos, eos


@dataclass(frozen=True)
class TinyModels:
    target: Path  # the Llama (also the STANDALONE draft)
    eagle: Path  # an EAGLE draft head for it (LlamaForCausalLMEagle), see eagle_head_weights


def build_tiny_models(root: Path, *, seed: int = 0) -> TinyModels:
    """Write the target Llama and its EAGLE head under ``root``."""
    gen = torch.Generator().manual_seed(seed)
    target, eagle = root / "tiny-llama", root / "tiny-llama-eagle"
    for folder in (target, eagle):
        folder.mkdir(parents=True, exist_ok=True)
        write_tokenizer(folder)
    write_config(target, architecture="LlamaForCausalLM", layers=LAYERS)
    save_weights(target, llama_weights(gen))
    write_config(eagle, architecture="LlamaForCausalLMEagle", layers=1)
    save_weights(eagle, eagle_head_weights(gen))
    return TinyModels(target, eagle)


def write_hf_model(folder: Path, model_class, config, *, seed: int, init=None) -> Path:
    """A Hugging Face ``model_class(config)`` drawn from ``seed`` (then ``init(model)``,
    under the same seed and no_grad, where given), saved in fp32 to ``folder`` with
    the shared tokenizer; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).float()
        if init is not None:
            with torch.no_grad():
                init(model)
    model.save_pretrained(folder)
    return folder


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE of at most ``VOCAB`` tokens, trained on local text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    bos, eos = SPECIAL_TOKENS
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
        "model_max_length": MAX_POSITIONS}))


def training_text() -> list[str]:
    """Source text of a few standard-library modules: local, and plenty for 1024 tokens."""
    import argparse
    import inspect
    import textwrap

    return [inspect.getsource(module) for module in (argparse, textwrap)]


def write_config(folder: Path, *, architecture: str, layers: int) -> None:
    (folder / "config.json").write_text(json.dumps({
        "architectures": [architecture], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers, "num_attention_heads": Q_HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32"}, indent=1))


def llama_weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    weights = {"model.embed_tokens.weight": normal(gen, VOCAB, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN),
               "lm_head.weight": normal(gen, VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        weights.update(decoder_layer(gen, f"model.layers.{layer}.", input_norm=True))
    return weights


def eagle_head_weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """An "echo" head under EAGLE-1 checkpoint names. ``fc`` joins the token
    embedding and the target's hidden state; here it keeps only the hidden
    state, and the layer's (random) attention and MLP write nothing back (zero
    ``o_proj`` and ``down_proj``), so the head hands the target's hidden state
    on unchanged and proposes, through the target's lm_head (SGLang shares the
    target's embedding and lm_head with it), the target's own choice at the
    root again. Drafts then get accepted wherever the output repeats a token:
    a known acceptance (``greedy_reference.echo_drafter``). Layer 0 of an
    EAGLE head has no input norm."""
    weights = {"fc.weight": torch.cat([torch.zeros(HIDDEN, HIDDEN), torch.eye(HIDDEN)], dim=1),
               "fc.bias": torch.zeros(HIDDEN)}
    weights.update(decoder_layer(gen, "layers.0.", input_norm=False))
    weights["layers.0.self_attn.o_proj.weight"].zero_()
    weights["layers.0.mlp.down_proj.weight"].zero_()
    return weights


def decoder_layer(gen: torch.Generator, prefix: str, *, input_norm: bool) -> dict[str, torch.Tensor]:
    q, kv = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    weights = {
        "self_attn.q_proj.weight": normal(gen, q, HIDDEN),
        "self_attn.k_proj.weight": normal(gen, kv, HIDDEN),
        "self_attn.v_proj.weight": normal(gen, kv, HIDDEN),
        "self_attn.o_proj.weight": normal(gen, HIDDEN, q),
        "mlp.gate_proj.weight": normal(gen, INTERMEDIATE, HIDDEN),
        "mlp.up_proj.weight": normal(gen, INTERMEDIATE, HIDDEN),
        "mlp.down_proj.weight": normal(gen, HIDDEN, INTERMEDIATE),
        "post_attention_layernorm.weight": torch.ones(HIDDEN),
    }
    if input_norm:
        weights["input_layernorm.weight"] = torch.ones(HIDDEN)
    return {prefix + name: tensor for name, tensor in weights.items()}


def normal(gen: torch.Generator, rows: int, cols: int, std: float = 0.02) -> torch.Tensor:
    return std * torch.randn(rows, cols, generator=gen)


def save_weights(folder: Path, weights: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in weights.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
