"""Build the tiny decoders the generation tests run on, in a few seconds each.

The default is a Llama with SmolLM2's layout at toy size (2 layers, d_model 64, 4 query heads, 2
KV heads, head_dim 16, tied embeddings, ChatML template); ``FAMILIES`` holds the same size for
every supported family (Mistral, Qwen 2/3, Gemma 1/2/3, Phi-3, Llama with rope scaling and
biases), with sliding windows shorter than the tests' prompts where the family has them. The
weights are random from a fixed seed (norm weights and biases too, which transformers would
initialise to constants), and the byte-level BPE tokenizer (512 tokens) is trained on the
built-in English text, so that characters outside ASCII become several byte tokens (what
streaming detokenization must not split).

    python tools/build_tiny_decoder.py OUT_DIR [FAMILY]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SEED = 0
# The default family's config (the vocabulary size is the trained tokenizer's); tests/
# fast_packages.py builds the same model without torch from it.
CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    # Wider than the default 0.02 so that logits are far apart and greedy choices are
    # decided by the model, not by float rounding.
    "initializer_range": 0.25,
}
_LONGROPE = {  # Phi-3 128k style: factors per rotary frequency (head_dim 16 -> 8)
    "type": "longrope",
    "short_factor": [1.0, 1.1, 1.2, 1.4, 1.7, 2.1, 2.6, 3.2],
    "long_factor": [1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0, 12.0],
}
# name -> (model_type, config overrides). Windows of 8 tokens slide inside the tests' prompts.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama3-rope-bias": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "attention_bias": True,
            "mlp_bias": True,
        },
    ),
    "llama-linear-rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-dynamic-rope": ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    "mistral": ("mistral", {"sliding_window": 8}),
    "mistral-long-window": ("mistral", {"sliding_window": 4096}),
    "qwen2": ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    "qwen3": ("qwen3", {}),
    "gemma": ("gemma", {"hidden_act": "gelu_pytorch_tanh"}),
    "gemma2": (
        "gemma2",
        {"sliding_window": 8, "query_pre_attn_scalar": 24, "final_logit_softcapping": 5.0},
    ),
    "gemma3": (
        "gemma3_text",
        {
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 24,
            "rope_theta": 1_000_000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        },
    ),
    "phi3": (
        "phi3",
        {"rope_scaling": _LONGROPE, "original_max_position_embeddings": 128, "sliding_window": 8},
    ),
    "phi3-partial-rotary": (  # Phi-4-mini style: half of each head rotated
        "phi3",
        {
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "partial_rotary_factor": 0.5,
        },
    ),
}


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


def build(out_dir: Path, family: str = "llama") -> Path:
    """Write the tiny model folder (config, weights, tokenizer) of ``family`` (a key of
    ``FAMILIES``) into ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgeinfer.export.data.text import builtin_text

    model_type, overrides = FAMILIES[family]
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(builtin_text("calibration", 200), out_dir / "tokenizer.json")
    fields: dict[str, Any] = {"vocab_size": vocab, **CONFIG, **overrides}
    config = AutoConfig.for_model(model_type, **fields)
    config._attn_implementation = "eager"  # the plain reference: no fused kernels
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms and biases start as constants: make them count
        for name, param in model.named_parameters() if family != "llama" else ():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.2 * torch.randn_like(param))
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
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    print(build(Path(sys.argv[1]), *sys.argv[2:]))
