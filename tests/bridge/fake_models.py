"""Models that fail on request, for the worker's error paths (no broker, no onnxruntime).

A text of ``raise:input`` / ``raise:engine`` / ``raise:bug`` makes ``FakeEncoder`` raise an
``InputError`` / ``InferenceError`` / ``RuntimeError``; a prompt starting with the same word
makes ``FakeDecoder`` raise after its first chunk. ``FakeDecoder`` follows the runtime's stream
contract: ``stop=`` and ``timeout_s`` are the runtime's, the last chunk carries
``finish_reason``, and closing the iterator cancels the sequence.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from edgeinfer.errors import InferenceError, InputError

__all__ = ["FakeChunk", "FakeDecoder", "FakeEncoder", "raise_for"]


def raise_for(text: str) -> None:
    """Raise what ``text`` asks for (nothing for an ordinary text)."""
    if text == "raise:input":
        raise InputError("the model refuses this input")
    if text == "raise:engine":
        raise InferenceError("the session failed")
    if text == "raise:bug":
        raise RuntimeError("a bug")


def _manifest(kind: str) -> Any:
    return SimpleNamespace(io=SimpleNamespace(kind=kind), digest="f" * 64, precision="fp32")


class FakeEncoder:
    """An embed model: each text's vector is its length (thread-safe counting)."""

    task = "embed"

    def __init__(self) -> None:
        self.manifest = _manifest("text-encoder")
        self.calls = 0
        self._lock = threading.Lock()

    def embed_with_info(self, texts: Sequence[str], *, truncate: bool = True) -> list[Any]:
        with self._lock:
            self.calls += 1
        for text in texts:
            raise_for(text)
        return [SimpleNamespace(vector=np.array([len(t)], np.float32), cached=False) for t in texts]


@dataclass(frozen=True)
class FakeChunk:
    """The runtime's ``TextChunk`` with the scheduler's ``finish_reason`` on the last one."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None


class FakeDecoder:
    """A generate model: one token per word of ``words`` (the prompt's own words by default),
    with the runtime's finish reasons; ``on_token(i)`` runs after token ``i`` was taken (a
    test moves its clock there, so a deadline passes at an exact token)."""

    task = "generate"
    max_sequences = 1

    def __init__(
        self,
        *,
        words: Sequence[str] | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> None:
        self.manifest = _manifest("decoder")
        self.words = words
        self.on_token = on_token
        self.calls: list[dict[str, Any]] = []
        self.closed = 0

    def stream(self, prompt: Any, **kwargs: Any) -> Iterator[FakeChunk]:
        self.calls.append({"prompt": prompt, **kwargs})
        return self._chunks(str(prompt), **kwargs)

    def _chunks(
        self,
        prompt: str,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] = (),
        timeout_s: float | None = None,
        **_: Any,
    ) -> Iterator[FakeChunk]:
        words = list(self.words if self.words is not None else prompt.split())
        text, reason = "", "eos"
        try:
            for i, word in enumerate(words[:max_new_tokens]):
                if i == 1:
                    raise_for(words[0])
                piece = word if i == 0 else " " + word
                cut = next(((text + piece).find(s) for s in stop if s in text + piece), None)
                if cut is not None:
                    yield FakeChunk((text + piece)[len(text) : cut], (i,), "stop")
                    return
                text += piece
                last = i + 1 == min(len(words), max_new_tokens)
                if last:
                    reason = "length" if len(words) >= max_new_tokens else "eos"
                yield FakeChunk(piece, (i,), reason if last else None)
                if self.on_token is not None:
                    self.on_token(i)
            if not words:
                yield FakeChunk("", (), "eos")
        finally:
            self.closed += 1
