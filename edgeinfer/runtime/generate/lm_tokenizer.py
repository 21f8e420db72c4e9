"""A decoder package's tokenizer behind one small protocol, with two implementations:
``tokenizer.json`` in ``tokenizers`` (every package) and the light SentencePiece model
(``io.light_tokenizer``, SentencePiece-family packages), used when ``sentencepiece`` is installed.

A 262k-piece vocabulary (Gemma 3) costs ~100-300 MB in ``tokenizers`` and a few MB in
SentencePiece; the export ships the light model only where it gives the same ids on its checks
(``export/decoder/light_tokenizer.py``), so the two are interchangeable. Both split the
special (control) tokens written in a text out first, as llama.cpp does with special parsing.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from edgeinfer.errors import PackageError
from edgeinfer.package_io import DecoderIO

__all__ = ["JsonTokenizer", "LMTokenizer", "SentencePieceTokenizer", "load_tokenizer"]

log = logging.getLogger(__name__)

# one generated token id -> the text it completes (whole characters only), None for none yet
DecodeStep = Callable[[int], "str | None"]


class LMTokenizer(Protocol):
    """What generation needs of a tokenizer."""

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``; special tokens written in it become their ids; no BOS added."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens dropped."""
        ...

    def decode_step(self) -> DecodeStep:
        """A fresh incremental decoder: fed the ids one by one, it returns the new text."""
        ...

    def special_pieces(self) -> list[str]:
        """The special tokens' texts, sorted."""
        ...


def load_tokenizer(package: Path, io: DecoderIO) -> LMTokenizer:
    """The package's light tokenizer when it ships one and ``sentencepiece`` is installed,
    else its ``tokenizer.json``; only the one used is loaded."""
    if io.light_tokenizer:
        if importlib.util.find_spec("sentencepiece") is not None:
            return SentencePieceTokenizer(package / io.light_tokenizer)
        log.info(
            "%s ships a light tokenizer: pip install 'edgeinfer[light-tokenizer]' to load it "
            "instead of %s (less memory)",
            package.name,
            io.tokenizer,
        )
    return JsonTokenizer(package / io.tokenizer)


class JsonTokenizer:
    """A ``tokenizer.json`` in ``tokenizers``."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on parse errors
            raise PackageError(f"cannot read the tokenizer {path}: {exc}; re-export it") from exc

    def encode(self, text: str) -> list[int]:
        """See ``LMTokenizer.encode``."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """See ``LMTokenizer.decode``."""
        return str(self._tok.decode(list(ids)))

    def decode_step(self) -> DecodeStep:
        """See ``LMTokenizer.decode_step``: tokenizers' ``DecodeStream``."""
        from tokenizers.decoders import DecodeStream

        step, tok = DecodeStream(skip_special_tokens=True).step, self._tok

        def decode_one(token: int) -> str | None:
            piece: str | None = step(tok, token)
            return piece

        return decode_one

    def special_pieces(self) -> list[str]:
        """See ``LMTokenizer.special_pieces``."""
        added = self._tok.get_added_tokens_decoder().values()
        return sorted(str(t.content) for t in added if t.special)


class SentencePieceTokenizer:
    """A SentencePiece model (``tokenizer.model``) in ``sentencepiece``; its control and
    unknown pieces are the special tokens. Decoding and streaming follow tokenizers'
    (``ByteFallback``: a run of byte pieces that is not UTF-8 gives one U+FFFD per piece;
    ``DecodeStream``), so the text is the same whichever tokenizer a device loads."""

    def __init__(self, path: Path) -> None:
        import sentencepiece

        try:
            sp: Any = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as exc:
            raise PackageError(f"cannot read the tokenizer {path}: {exc}; re-export it") from exc
        self._sp = sp
        self._size = int(sp.get_piece_size())
        special = [i for i in range(self._size) if sp.is_control(i) or sp.is_unknown(i)]
        self._special_ids = frozenset(special)
        self._special = {sp.id_to_piece(i): i for i in special}
        # Where a special token may start, and its lengths, longest first (leftmost-longest,
        # as tokenizers matches them); a regex of Gemma's 6,249 specials would hold 4 MB.
        self._lengths = sorted({len(p) for p in self._special}, reverse=True)
        firsts = "".join(sorted({p[0] for p in self._special}))
        self._starts = re.compile(f"[{re.escape(firsts)}]") if firsts else None
        # A dummy prefix ("▁" before each text) is dropped again from the first decoded piece.
        self._strip_first = sp.decode_pieces(["▁a"]) == "a"

    def encode(self, text: str) -> list[int]:
        """See ``LMTokenizer.encode``."""
        if self._starts is None:
            return list(self._sp.encode(text))
        ids: list[int] = []
        done = 0  # the text before it is encoded
        for start in self._starts.finditer(text):
            at = start.start()
            if at < done:
                continue
            for length in self._lengths:
                piece = text[at : at + length]
                special = self._special.get(piece)
                if special is not None:
                    if at > done:
                        ids.extend(self._sp.encode(text[done:at]))
                    ids.append(special)
                    done = at + len(piece)
                    break
        if done < len(text):
            ids.extend(self._sp.encode(text[done:]))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """See ``LMTokenizer.decode``; ids past the vocabulary (a graph's padded rows) are
        dropped, as tokenizers does."""
        skip, size = self._special_ids, self._size
        kept = [i for i in ids if i not in skip and 0 <= i < size]
        text = str(self._sp.decode(kept))
        # SentencePiece replaces invalid bytes one by one: redo those texts as tokenizers does
        return self._by_pieces(kept) if "\ufffd" in text else text

    def _by_pieces(self, ids: list[int]) -> str:
        """The text of ``ids`` piece by piece, each run of byte pieces decoded at once."""
        sp, out, run = self._sp, [], bytearray()
        for i in ids:
            piece: str = sp.id_to_piece(i)
            if sp.is_byte(i):  # "<0xE2>"
                run.append(int(piece[3:5], 16))
                continue
            if run:
                out.append(_utf8_or_replaced(run))
                run.clear()
            out.append(piece.replace("▁", " "))
        if run:
            out.append(_utf8_or_replaced(run))
        text = "".join(out)
        return text[1:] if self._strip_first and text.startswith(" ") else text

    def decode_step(self) -> DecodeStep:
        """See ``LMTokenizer.decode_step``: tokenizers' ``DecodeStream`` over ``decode``."""
        return _DecodeStream(self.decode, None if self._strip_first else self._surface).step

    def _surface(self, token: int) -> str | None:
        """The text of a plain piece (decoding is then concatenation); None for the others:
        special, byte and out-of-vocabulary ids."""
        if token in self._special_ids or not 0 <= token < self._size or self._sp.is_byte(token):
            return None
        return str(self._sp.id_to_piece(token)).replace("▁", " ")

    def special_pieces(self) -> list[str]:
        """See ``LMTokenizer.special_pieces``."""
        return sorted(self._special)


def _utf8_or_replaced(run: bytearray) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


class _DecodeStream:
    """tokenizers' ``DecodeStream`` over any ``decode``: decode a short window of the last
    ids; emit what it adds to the window's previous text, unless that ends in U+FFFD (an
    incomplete character: wait for the next id).

    ``surface`` (a plain piece's text, None for any other id) lets a window of plain pieces
    be decoded by joining their texts, without a ``decode`` call: the same text, faster.
    """

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        surface: Callable[[int], str | None] | None = None,
    ) -> None:
        self._decode, self._surface = decode, surface
        self._ids: list[int] = []
        self._parts: list[str] | None = [] if surface else None  # the window's plain texts
        self._prefix = ""
        self._prefix_index = 0

    def _text(self) -> str:
        return "".join(self._parts) if self._parts is not None else self._decode(self._ids)

    def step(self, token: int) -> str | None:
        if not self._prefix and self._ids:
            prefix = self._text()
            if not prefix.endswith("\ufffd"):
                self._prefix, self._prefix_index = prefix, len(self._ids)
        self._ids.append(token)
        if self._parts is not None:
            part = self._surface(token) if self._surface else None
            self._parts = None if part is None else [*self._parts, part]
        text = self._text()
        if len(text) <= len(self._prefix) or text.endswith("\ufffd"):
            return None
        new = text[len(self._prefix) :]
        next_index = len(self._ids) - self._prefix_index
        self._ids = self._ids[self._prefix_index :]
        if self._parts is not None:
            self._parts = self._parts[self._prefix_index :]
        elif self._surface is not None:  # a window left with plain pieces only: joined again
            parts = [self._surface(i) for i in self._ids]
            self._parts = None if None in parts else [p for p in parts if p is not None]
        self._prefix = self._text()
        self._prefix_index = next_index
        return new
