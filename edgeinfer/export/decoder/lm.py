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
from edgeinfer.export.decoder.chat_template import chat_format
from edgeinfer.export.decoder.gguf_tokenizer import gguf_tokenizer
from edgeinfer.export.decoder.light_tokenizer import LIGHT_TOKENIZER_NAME, gguf_sentencepiece
from edgeinfer.export.gates.language import LMQuality
from edgeinfer.export.source import Source
from edgeinfer.package_io import DecoderIO

__all__ = [
    "TokenizerInfo",
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


def _gguf_context(tok: Any, meta: dict[str, Any]) -> dict[str, str]:
    """The special tokens map a GGUF source's chat template reads (``bos_token``, ...)."""
    names = {"bos_token": meta["bos"], "eos_token": meta["eos"], "pad_token": meta["pad"]}
    found = {k: tok.id_to_token(int(v)) for k, v in names.items() if v is not None}
    return {k: str(v) for k, v in found.items() if v is not None}


def _folder_tokenizer(source: Source) -> tuple[Any, dict[str, Any]]:
    """The folder's fast tokenizer, its special ids, and transformers' view of it: the
    special tokens map and chat rendering (the reference the package's format must equal) and
    whether it adds BOS to a plain text."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(str(source.path / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    try:
        hf = AutoTokenizer.from_pretrained(str(source.path))  # type: ignore[no-untyped-call]
    except Exception as exc:  # transformers raises many types
        raise ConversionError(f"transformers cannot load {source.name}'s tokenizer: {exc}") from exc

    def token_id(name: Any) -> int | None:
        found = tok.token_to_id(name) if isinstance(name, str) else None
        return int(found) if found is not None else None

    eos = token_id(hf.eos_token)
    if eos is None:
        eos_cfg = source.config.get("eos_token_id")
        eos = eos_cfg[0] if isinstance(eos_cfg, list) else eos_cfg
    bos, pad = token_id(hf.bos_token), token_id(hf.pad_token)
    template = hf.chat_template if isinstance(hf.chat_template, str) else None
    return tok, {
        "bos": bos,
        "eos": eos,
        "pad": pad if pad is not None else eos,
        "add_bos": bos is not None and hf("a").input_ids[:1] == [bos],
        "chat_template": template,
        "context": dict(hf.special_tokens_map),
        "reference": (
            (lambda m: hf.apply_chat_template(list(m), tokenize=False, add_generation_prompt=True))
            if template
            else None
        ),
    }


def _config_eos(source: Source) -> set[int]:
    """The end-of-generation ids of the model's config and generation_config.json (Gemma's
    and Llama 3's instruct models end a turn with a token other than the tokenizer's eos)."""
    found: set[int] = set()
    if source.gguf_file:  # the file's own tokenizer metadata says it (transformers' reading
        return found  # of a GGUF may name another token)
    configs = [source.config]
    generation = source.path / "generation_config.json"
    if generation.is_file():
        configs.append(json.loads(generation.read_text()))
    for config in configs:
        value = config.get("eos_token_id")
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int):
                found.add(item)
    return found


@dataclass(frozen=True)
class TokenizerInfo:
    """What the package's tokenizer says, as the decoder builder writes it into the manifest.

    Attributes:
        tokens: ``bos`` (None when the model has none), ``eos`` and ``pad`` ids.
        add_bos_token: whether a plain-text prompt starts with BOS.
        stop_token_ids: every id that ends a generation, sorted.
        chat_template: the jinja source, None for a model without one.
        chat_format: the runtime's form of it (checked against transformers' rendering).
        sentencepiece: the serialized SentencePiece model of a SentencePiece-family source
            (a ``llama`` GGUF's vocabulary, or the folder's own tokenizer.model), else None.
    """

    tokens: dict[str, int | None]
    add_bos_token: bool
    stop_token_ids: tuple[int, ...]
    chat_template: str | None
    chat_format: dict[str, Any] | None
    sentencepiece: bytes | None


def prepare_decoder_tokenizer(source: Source, out_path: Path) -> TokenizerInfo:
    """Write the package tokenizer to ``out_path`` and say what it holds."""
    folder_model = source.path / LIGHT_TOKENIZER_NAME
    if source.gguf_file:
        tok, meta = gguf_tokenizer(source.path / source.gguf_file)
        meta["context"] = _gguf_context(tok, meta)
        vocab = meta.get("sentencepiece")
        light = gguf_sentencepiece(vocab) if vocab else None
    else:
        tok, meta = _folder_tokenizer(source)
        light = folder_model.read_bytes() if folder_model.is_file() else None
    if meta["eos"] is None:
        raise ConversionError(f"{source.name} names no eos token")
    tok.save(str(out_path))
    stops = {int(meta["eos"]), *_config_eos(source)}
    end_of_text = tok.token_to_id("<|endoftext|>")
    if end_of_text is not None:
        stops.add(int(end_of_text))  # base-model end marker: also ends a chat turn
    template = meta["chat_template"]
    return TokenizerInfo(
        tokens={
            "bos": meta["bos"],
            "eos": int(meta["eos"]),
            "pad": int(meta["pad"]) if meta["pad"] is not None else int(meta["eos"]),
        },
        add_bos_token=bool(meta["add_bos"]),
        stop_token_ids=tuple(sorted(stops)),
        chat_template=template,
        sentencepiece=light,
        chat_format=(
            chat_format(template, context=meta["context"], reference=meta.get("reference"))
            if template
            else None
        ),
    )


def full_logits(session: Any, io: DecoderIO, ids: Sequence[int]) -> np.ndarray:
    """Logits [S, V] of ``ids`` in one run from position 0 with an empty past (no cache)."""
    s = len(ids)
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.asarray(ids, np.int64)[None],
        "attention_mask": np.ones((1, s), np.int64),
        "position_ids": np.arange(s, dtype=np.int64)[None],
    }
    if io.logits_input:
        feeds[io.logits_input] = np.array([s], np.int64)  # every position's logits
    if io.extra_row_input:
        feeds[io.extra_row_input] = np.ones(1, np.int64)
    empty = np.zeros((1, io.num_kv_heads, 0, io.head_dim), np.dtype(io.kv_dtype))
    for names in io.past_names:
        for name in names:
            feeds[name] = empty
    logits: np.ndarray = session.run(["logits"], feeds)[0]
    first: np.ndarray = logits[0]
    return first


def parity(
    model: Any,
    session: Any,
    io: DecoderIO,
    texts: Sequence[Sequence[int]],
    *,
    max_abs_logit: float = PARITY_MAX_ABS_LOGIT,
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
    if worst > max_abs_logit or agree / total < PARITY_MIN_AGREEMENT:
        raise ParityError(
            f"the fp32 decoder graph differs from PyTorch (max |logit diff| {worst:.2e} > "
            f"{max_abs_logit} or argmax agreement {agree / total:.4f} < "
            f"{PARITY_MIN_AGREEMENT}); this is an exporter bug"
        )
    return result


def quality(
    session: Any,
    io: DecoderIO,
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
