"""Build the tiny Llama-architecture decoder the generation tests run on, in a few seconds.

It has SmolLM2's layout at toy size (2 layers, d_model 64, 4 query heads, 2 KV heads, head_dim 16,
tied embeddings, ChatML template) with random weights from a fixed seed, and a byte-level BPE
tokenizer (512 tokens) trained on the built-in English text, so that characters outside ASCII
become several byte tokens (what streaming detokenization must not split).

    python tools/build_tiny_decoder.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SEED = 0


def build_tokenizer(texts: list[str], out: Path) -> int:
    """Train a byte-level BPE on ``texts``, write ``out`` and return the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(out))
    return int(tok.get_vocab_size())


def build(out_dir: Path) -> Path:
    """Write the tiny model folder (config, weights, tokenizer) into ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from edgeinfer.export.calibrate import builtin_text

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(builtin_text("calibration", 200), out_dir / "tokenizer.json")
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        # Wider than the default 0.02 so that logits are far apart and greedy choices are
        # decided by the model, not by float rounding.
        initializer_range=0.25,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHAT_TEMPLATE,
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|im_end|>",
                "unk_token": "<|endoftext|>",
                "add_bos_token": False,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=2,
        )
    )
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(Path(sys.argv[1])))
