"""Writes, offline, the model folders the live server loads with ``--load-format
dummy``: a config and a tokenizer, no weights.

- ``target/``: Llama-3.1-8B's shape (32 layers, hidden 4096, 32 query and 8 KV
  heads of 128, MLP 14336, vocab 128256, bf16, its llama3 RoPE scaling).
- ``draft/``: the same with ``--draft-layers`` layers, for
  ``--speculative-algorithm STANDALONE``.

The tokenizer is a byte-level BPE with exactly the model's vocabulary: the 256
byte symbols, then merges of byte pairs and of pairs with a third byte up to id
127999, then Llama 3's 256 special tokens (``<|begin_of_text|>`` = 128000,
``<|end_of_text|>`` = 128001, ...), so that every id the model can emit decodes.
Built with ``tokenizers`` from no data, in about a second.

    python bench/device/live_model.py --out .live/models [--draft-layers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 128256
FIRST_SPECIAL_ID = 128000
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": FIRST_SPECIAL_ID,
    "eos_token_id": FIRST_SPECIAL_ID + 1,
    # Without it transformers 5 takes a local folder for a Mistral one and warns
    # on every tokenizer load that its regex is wrong.
    "transformers_version": "5.12.1",
}


def special_tokens() -> list[str]:
    """Llama 3's 256 special tokens, in id order from 128000."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
             "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(named))]
    return named + reserved


def byte_level_bpe():
    """A ``tokenizers.Tokenizer`` of exactly VOCAB_SIZE ids (see the module doc)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merges = []

    def add(left: str, right: str) -> bool:
        if len(vocab) == FIRST_SPECIAL_ID:
            return False
        vocab[left + right] = len(vocab)
        merges.append((left, right))
        return True

    pairs = [a + b for a in alphabet for b in alphabet]
    for pair in pairs:  # 65536 two-byte tokens
        add(pair[0], pair[1])
    for pair in pairs:  # then three-byte ones, merging a pair with one more byte
        if not all(add(pair, c) for c in alphabet):
            break
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in special_tokens()])
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} ids, "
                           f"expected {VOCAB_SIZE}")
    return tokenizer


def write_model(folder: Path, num_layers: int, tokenizer) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(LLAMA_31_8B, num_hidden_layers=num_layers)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": FIRST_SPECIAL_ID, "eos_token_id": FIRST_SPECIAL_ID + 1,
         "do_sample": False}) + "\n")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "model_max_length": LLAMA_31_8B["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }, indent=1) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--draft-layers", type=int, default=2)
    args = parser.parse_args()
    tokenizer = byte_level_bpe()
    write_model(args.out / "target", LLAMA_31_8B["num_hidden_layers"], tokenizer)
    write_model(args.out / "draft", args.draft_layers, tokenizer)
    print(f"wrote {args.out}/target (32 layers) and {args.out}/draft "
          f"({args.draft_layers} layers), vocab {VOCAB_SIZE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
