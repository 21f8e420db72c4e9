"""A ``tokenizers`` tokenizer rebuilt from a GGUF file's metadata, tokenizing as llama.cpp does.

Two GGUF tokenizer models: ``gpt2`` (byte-level BPE with its merges) and ``llama``
(SentencePiece BPE: pieces with scores, merged highest score first, byte fallback). transformers'
own GGUF conversion gets both wrong for our sources: for SmolLM2 it adds ``<|im_start|>`` to
every text and reports it as EOS; for Gemma 3 it builds a Unigram model from the BPE scores,
which splits " world" into "▁w", "or", "ld" (llama.cpp: "▁world").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeinfer.errors import ConversionError

__all__ = ["gguf_tokenizer"]

# llama.cpp's token types
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6


def gguf_tokenizer(path: Path) -> tuple[Any, dict[str, Any]]:
    """The tokenizer of the GGUF file ``path`` and its ``bos``/``eos``/``pad`` ids,
    ``add_bos`` flag and ``chat_template`` (or None); for a ``llama`` (SentencePiece) file
    also ``sentencepiece``: the vocabulary ``light_tokenizer.gguf_sentencepiece`` takes."""
    from gguf import GGUFReader
    from tokenizers import AddedToken

    fields = GGUFReader(str(path)).fields

    def value(key: str) -> Any:
        return fields[key].contents() if key in fields else None

    kind = value("tokenizer.ggml.model")
    tokens: list[str] = value("tokenizer.ggml.tokens")
    types: list[int] = value("tokenizer.ggml.token_type")
    if kind == "gpt2":
        tok = _byte_level_bpe(tokens, value("tokenizer.ggml.merges"), value("tokenizer.ggml.pre"))
    elif kind == "llama":
        tok = _sentencepiece_bpe(tokens, value("tokenizer.ggml.scores"), types)
    else:
        raise ConversionError(f"GGUF tokenizer {kind!r} is not supported (supported: gpt2, llama)")
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == _CONTROL
        ]
    )
    add_bos = value("tokenizer.ggml.add_bos_token")
    meta = {
        "bos": value("tokenizer.ggml.bos_token_id"),
        "eos": value("tokenizer.ggml.eos_token_id"),
        "pad": value("tokenizer.ggml.padding_token_id"),
        # llama.cpp's default when the file does not say: SentencePiece models add BOS
        "add_bos": bool(add_bos) if add_bos is not None else kind == "llama",
        "chat_template": value("tokenizer.chat_template"),
    }
    if kind == "llama":  # what a SentencePiece model of the same vocabulary is made of
        meta["sentencepiece"] = {
            "tokens": tokens,
            "scores": value("tokenizer.ggml.scores"),
            "types": types,
            "unk": value("tokenizer.ggml.unknown_token_id"),
            "bos": meta["bos"],
            "eos": meta["eos"],
            "pad": meta["pad"],
            "add_space_prefix": value("tokenizer.ggml.add_space_prefix"),
        }
    return tok, meta


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs))
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":  # llama.cpp's "smollm": one digit per token
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _sentencepiece_bpe(tokens: list[str], scores: list[float], types: list[int]) -> Any:
    """SentencePiece BPE as llama.cpp runs it: spaces become "▁" (no dummy prefix), adjacent
    pieces merge when their concatenation is a piece, highest score first; characters without
    a piece fall back to byte tokens; user-defined pieces (runs of newlines or spaces) are
    matched in the raw text first."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = {t for t, k in zip(tokens, types, strict=True) if k == _NORMAL}
    merges: list[tuple[float, int, str, str]] = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                merges.append((-scores[vocab[piece]], vocab[piece], left, right))
    merges.sort()  # the highest-scoring result merges first
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(left, right) for _, _, left, right in merges],
            byte_fallback=True,
            unk_token=next((t for t in ("<unk>",) if t in vocab), None),
        )
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    user = [t for t, k in zip(tokens, types, strict=True) if k == _USER_DEFINED]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tok
