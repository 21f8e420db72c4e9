"""The generate export's pieces: the source decoder in PyTorch, its tokenizer and chat template
for the package, and the quality measures of the gate (perplexity, next-token agreement).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError, ParityError
from edgeinfer.export.source import Source
from edgeinfer.runtime.chat import render_chat

__all__ = [
    "LMQuality",
    "chat_format",
    "full_logits",
    "load_decoder",
    "parity",
    "prepare_decoder_tokenizer",
    "quality",
]

# fp32 ONNX vs PyTorch: float reassociation only. Logits of a 30-layer model move by ~1e-4.
PARITY_MAX_ABS_LOGIT = 1e-2
# Greedy choices may flip on near-ties; more than 1 % flips means a real difference.
PARITY_MIN_AGREEMENT = 0.99


def load_decoder(source: Source) -> Any:
    """The source decoder in PyTorch fp32 (from a GGUF file, dequantized, or a model folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    # eager: the plain attention math (SDPA would drop Gemma 2's attention softcapping)
    kwargs: dict[str, Any] = {"dtype": torch.float32, "attn_implementation": "eager"}
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    try:
        model = AutoModelForCausalLM.from_pretrained(str(source.path), **kwargs)
    except Exception as exc:  # transformers raises many types
        raise ConversionError(f"cannot load {source.name} with transformers: {exc}") from exc
    model.eval()  # type: ignore[no-untyped-call]  # torch's Module.eval is untyped
    return model


def state_numpy(model: Any) -> dict[str, np.ndarray]:
    """The model's weights as float32 numpy arrays (tied weights appear under both names)."""
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _gguf_tokenizer(path: Path) -> tuple[Any, dict[str, Any]]:
    """A ``tokenizers`` byte-level BPE rebuilt from the GGUF metadata.

    transformers' GGUF conversion adds a BOS (``<|im_start|>``) to every text and reports it as
    EOS; the GGUF itself says add_bos_token = false and eos = ``<|im_end|>``.
    """
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    fields = GGUFReader(str(path)).fields

    def value(key: str) -> Any:
        return fields[key].contents() if key in fields else None

    if value("tokenizer.ggml.model") != "gpt2":
        raise ConversionError(f"GGUF tokenizer {value('tokenizer.ggml.model')!r} is not supported")
    tokens: list[str] = value("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in value("tokenizer.ggml.merges")]
    types: list[int] = value("tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if value("tokenizer.ggml.pre") == "smollm":  # llama.cpp's "smollm": one digit per token
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [
        t for t, kind in zip(tokens, types, strict=True) if kind == 3
    ]  # 3: llama.cpp CONTROL
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    meta = {
        "bos": value("tokenizer.ggml.bos_token_id"),
        "eos": value("tokenizer.ggml.eos_token_id"),
        "pad": value("tokenizer.ggml.padding_token_id"),
        "chat_template": value("tokenizer.chat_template"),
    }
    return tok, meta


def _folder_tokenizer(source: Source) -> tuple[Any, dict[str, Any]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    config_path = source.path / "tokenizer_config.json"
    tcfg = json.loads(config_path.read_text()) if config_path.is_file() else {}

    def token_id(key: str) -> int | None:
        name = tcfg.get(key)
        name = name.get("content") if isinstance(name, dict) else name
        found = tok.token_to_id(name) if isinstance(name, str) else None
        return int(found) if found is not None else None

    eos = token_id("eos_token")
    if eos is None:
        eos_cfg = source.config.get("eos_token_id")
        eos = eos_cfg[0] if isinstance(eos_cfg, list) else eos_cfg
    pad = token_id("pad_token")
    return tok, {
        "bos": token_id("bos_token"),
        "eos": eos,
        "pad": pad if pad is not None else eos,
        "chat_template": tcfg.get("chat_template"),
    }


def prepare_decoder_tokenizer(source: Source, out_path: Path) -> dict[str, Any]:
    """Write the package tokenizer; return ``tokens`` (bos/eos/pad), the stop ids and the
    chat template (jinja source and the runtime's structured form)."""
    tok, meta = (
        _gguf_tokenizer(source.path / source.gguf_file)
        if source.gguf_file
        else _folder_tokenizer(source)
    )
    if meta["eos"] is None:
        raise ConversionError(f"{source.name} names no eos token")
    tok.save(str(out_path))
    stops = {int(meta["eos"])}
    end_of_text = tok.token_to_id("<|endoftext|>")
    if end_of_text is not None:
        stops.add(int(end_of_text))  # base-model end marker: also ends a chat turn
    template = meta["chat_template"]
    return {
        "tokens": {
            "bos": meta["bos"],
            "eos": int(meta["eos"]),
            "pad": int(meta["pad"]) if meta["pad"] is not None else int(meta["eos"]),
        },
        "stop_token_ids": sorted(stops),
        "chat_template": template,
        "chat_format": chat_format(template) if template else None,
    }


def _render(template: str, messages: list[dict[str, str]], *, generation: bool) -> str:
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    return str(
        env.from_string(template).render(messages=messages, add_generation_prompt=generation)
    )


def chat_format(template: str) -> dict[str, Any]:
    """Turn a jinja chat template into the runtime's structured form (no jinja on devices):
    ``prefix``, one ``message`` pattern with ``{role}``/``{content}``, ``default_system`` and
    ``generation_prompt``; verified against the template on several conversations."""
    sys_msg, user = {"role": "system", "content": "S1"}, {"role": "user", "content": "U1"}
    only_sys = _render(template, [sys_msg], generation=False)
    sys_user = _render(template, [sys_msg, user], generation=False)
    message = sys_user[len(only_sys) :]
    if not sys_user.startswith(only_sys) or message.count("user") != 1 or message.count("U1") != 1:
        raise ConversionError("the chat template is not a fixed per-message pattern")
    pattern = message.replace("user", "{role}").replace("U1", "{content}")
    sys_part = pattern.replace("{role}", "system").replace("{content}", "S1")
    if not only_sys.endswith(sys_part):
        raise ConversionError("the chat template formats the system message differently")
    prefix = only_sys[: len(only_sys) - len(sys_part)]
    generation_prompt = _render(template, [sys_msg, user], generation=True)[len(sys_user) :]
    user_only = _render(template, [user], generation=False)
    middle = user_only[len(prefix) : len(user_only) - len(message)]
    head, _, tail = pattern.replace("{role}", "system").partition("{content}")
    default_system = middle[len(head) : len(middle) - len(tail)] if middle else None
    fmt = {
        "prefix": prefix,
        "message": pattern,
        "default_system": default_system,
        "generation_prompt": generation_prompt,
    }
    checks = [
        [user],
        [sys_msg, user, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}],
        [user, {"role": "assistant", "content": "a {content} b"}],
    ]
    for messages in checks:
        if render_chat(fmt, messages) != _render(template, messages, generation=True):
            raise ConversionError("the chat template cannot be expressed for the runtime")
    return fmt


def full_logits(session: Any, io: dict[str, Any], ids: Sequence[int]) -> np.ndarray:
    """Logits [S, V] of ``ids`` in one run from position 0 with an empty past (no cache)."""
    s = len(ids)
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.asarray(ids, np.int64)[None],
        "attention_mask": np.ones((1, s), np.int64),
        "position_ids": np.arange(s, dtype=np.int64)[None],
    }
    empty = np.zeros((1, int(io["num_kv_heads"]), 0, int(io["head_dim"])), np.float32)
    for names in io["past_names"]:
        for name in names:
            feeds[name] = empty
    logits: np.ndarray = session.run(["logits"], feeds)[0]
    first: np.ndarray = logits[0]
    return first


def parity(
    model: Any, session: Any, io: dict[str, Any], texts: Sequence[Sequence[int]]
) -> dict[str, float]:
    """fp32 ONNX vs PyTorch logits on ``texts`` (token ids); raise ``ParityError`` outside the
    stated tolerance. Decode steps are covered by the runtime's KV-vs-recompute test."""
    import torch

    worst, agree, total = 0.0, 0, 0
    for ids in texts:
        with torch.no_grad():
            ref = model(torch.tensor([list(ids)])).logits[0].numpy()
        got = full_logits(session, io, ids)
        worst = max(worst, float(np.abs(ref - got).max()))
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
    result = {"max_abs_logit_diff": worst, "argmax_agreement": agree / total}
    if worst > PARITY_MAX_ABS_LOGIT or agree / total < PARITY_MIN_AGREEMENT:
        raise ParityError(
            f"the fp32 decoder graph differs from PyTorch (max |logit diff| {worst:.2e} > "
            f"{PARITY_MAX_ABS_LOGIT} or argmax agreement {agree / total:.4f} < "
            f"{PARITY_MIN_AGREEMENT}); this is an exporter bug"
        )
    return result


@dataclass(frozen=True)
class LMQuality:
    """A variant's quality on held text, teacher-forced.

    ``perplexity`` is exp(mean next-token NLL); ``agreement`` the share of positions whose
    argmax equals the fp32 graph's argmax (1.0 for fp32 itself).
    """

    perplexity: float
    agreement: float
    tokens: int
    min_agreement: float = 1.0  # the lowest agreement of one held text

    def passes(self, fp32: LMQuality, *, max_ppl_increase: float, min_agreement: float) -> bool:
        """The gate: perplexity within ``max_ppl_increase`` (fraction) of fp32 and agreement
        at least ``min_agreement``."""
        return (
            self.perplexity <= fp32.perplexity * (1.0 + max_ppl_increase)
            and self.agreement >= min_agreement
        )


def quality(
    session: Any,
    io: dict[str, Any],
    texts: Sequence[Sequence[int]],
    fp32_argmax: list[np.ndarray] | None,
) -> tuple[LMQuality, list[np.ndarray]]:
    """Perplexity and agreement of ``session`` on ``texts``; also its argmax per text."""
    nll, count, agree, worst = 0.0, 0, 0, 1.0
    argmaxes = []
    for k, ids in enumerate(texts):
        logits = full_logits(session, io, ids).astype(np.float64)  # [S, V]
        shifted = logits[:-1] - logits[:-1].max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll -= float(logp[np.arange(len(ids) - 1), np.asarray(ids[1:])].sum())
        count += len(ids) - 1
        top = logits.argmax(-1)
        argmaxes.append(top)
        same = int((top == (fp32_argmax[k] if fp32_argmax else top)).sum())
        agree += same
        worst = min(worst, same / len(ids))
    positions = sum(len(ids) for ids in texts)
    return LMQuality(float(np.exp(nll / count)), agree / positions, count, worst), argmaxes
