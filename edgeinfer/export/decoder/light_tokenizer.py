"""The package's light tokenizer: a SentencePiece model (``tokenizer.model``, a few MB) beside
``tokenizer.json`` (tens of MB, ~100-300 MB once ``tokenizers`` has expanded a 262k vocabulary).

Built for SentencePiece-family sources: a ``llama`` GGUF (its pieces, scores and types, as
llama.cpp tokenizes: BPE merged highest score first, byte fallback, user-defined pieces matched
first, spaces escaped to "▁", a dummy prefix only when the file asks for one), or a model folder
that ships its own ``tokenizer.model``. It ships only when it encodes every check text (held,
calibration and chat texts, special tokens inside text) to the ids ``tokenizer.json`` gives and
decodes them back alike; otherwise the package keeps ``tokenizer.json`` alone (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.errors import PackageError
from edgeinfer.runtime.generate.lm_tokenizer import JsonTokenizer, SentencePieceTokenizer

__all__ = [
    "LIGHT_TOKENIZER_NAME",
    "PROBE_TEXTS",
    "disagreement",
    "gguf_sentencepiece",
    "write_light_tokenizer",
]

log = logging.getLogger(__name__)

LIGHT_TOKENIZER_NAME = "tokenizer.model"

# Texts where tokenizers tend to part: runs of spaces and newlines, digits, non-ASCII,
# characters without a piece (byte fallback), a leading space, the empty string.
PROBE_TEXTS = (
    "",
    " ",
    "Hello world",
    " Hello  world   and    tabs\t\tand\nnew\n\n\nlines \n ",
    "1234567890 3.14159 2026-12-01 0x1F",
    "naïve café, Zürich, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית, हिन्दी",
    "emoji 🙂👍🏽🧑‍🚀 and rare ⾀ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u0000\u0007 chars",
    "def f(x):\n    return x ** 2  # code\n\treturn\r\n",
    "▁already▁escaped▁",
)

# SentencePiece's piece types (the same numbers as llama.cpp's token types)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def gguf_sentencepiece(vocab: dict[str, Any]) -> bytes:
    """A serialized SentencePiece ``ModelProto`` (BPE, byte fallback) of a ``llama`` GGUF's
    vocabulary: ``tokens``, ``scores``, ``types``, ``unk``/``bos``/``eos``/``pad`` ids and
    ``add_space_prefix`` (llama.cpp's default when the file does not say: a dummy prefix)."""
    from sentencepiece import sentencepiece_model_pb2

    spm: Any = sentencepiece_model_pb2  # generated protobuf code: no static types
    model = spm.ModelProto()
    unk = vocab["unk"]
    for i, (piece, score, kind) in enumerate(
        zip(vocab["tokens"], vocab["scores"], vocab["types"], strict=True)
    ):
        entry = model.pieces.add()
        # user-defined pieces are matched after spaces are escaped (llama.cpp: in raw text)
        entry.piece = piece.replace(" ", "▁") if kind == _USER_DEFINED else piece
        entry.score = float(score)
        # SentencePiece needs one unknown piece; a GGUF may mark it control (Gemma 3)
        entry.type = _UNKNOWN if i == unk else kind if kind in range(1, 7) else _NORMAL
    trainer = model.trainer_spec
    trainer.model_type = spm.TrainerSpec.BPE
    trainer.vocab_size = len(vocab["tokens"])
    trainer.byte_fallback = True
    trainer.unk_id = unk if unk is not None else -1
    for name in ("bos", "eos", "pad"):
        setattr(trainer, f"{name}_id", vocab[name] if vocab[name] is not None else -1)
    trainer.unk_surface = ""  # tokenizers skips <unk> as a special token when decoding
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    add_space_prefix = vocab["add_space_prefix"]
    normalizer.add_dummy_prefix = True if add_space_prefix is None else bool(add_space_prefix)
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return bytes(model.SerializeToString())


def write_light_tokenizer(
    model: bytes, out_path: Path, *, reference: Path, texts: Sequence[str]
) -> bool:
    """Write the SentencePiece ``model`` to ``out_path`` if it tokenizes ``texts`` as the
    ``reference`` tokenizer.json does (``disagreement``); False, nothing written, and the
    reason logged if not."""
    out_path.write_bytes(model)
    try:
        why = disagreement(out_path, reference, texts)
    except PackageError as exc:  # sentencepiece refused the model
        why = str(exc)
    if why is not None:
        out_path.unlink()
        log.warning("the package ships tokenizer.json alone: its SentencePiece model %s", why)
        return False
    return True


def disagreement(light: Path, reference: Path, texts: Sequence[str]) -> str | None:
    """Why the SentencePiece model ``light`` cannot stand in for ``reference`` (a
    tokenizer.json) on ``texts`` (each also with every special token inside it), or None."""
    sp, tok = SentencePieceTokenizer(light), JsonTokenizer(reference)
    specials = sp.special_pieces()
    if specials != tok.special_pieces():
        return "the two tokenizers split out different special tokens"
    joined = "".join(specials)
    cases = [*PROBE_TEXTS, *texts, *(f"a{s} b{s}\n{s}" for s in specials[:64]), joined]
    for text in cases:
        ids = tok.encode(text)
        got = sp.encode(text)
        if got != ids:
            return (
                f"encodes {text[:60]!r} to {got[:16]}... where tokenizer.json gives {ids[:16]}..."
            )
        if sp.decode(ids) != tok.decode(ids):
            return f"decodes the ids of {text[:60]!r} to {sp.decode(ids)[:60]!r}"
    return None
