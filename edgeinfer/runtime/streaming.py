"""What a generation streams and returns, and the stop-string bookkeeping of streaming: text
is sent only once no stop string can still begin in it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FinishReason",
    "GenerationResult",
    "StreamState",
    "TextChunk",
    "first_stop",
    "held_back",
]

FinishReason = Literal["eos", "stop", "length", "deadline"]


@dataclass(frozen=True)
class TextChunk:
    """A piece of streamed text: ``text`` is new, complete characters (never half of one);
    ``token_ids`` are the tokens generated since the previous chunk."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class GenerationResult:
    """One finished generation.

    Attributes:
        text: the generated text (prompt excluded, cut before a stop string).
        token_ids: the generated token ids (an eos token excluded).
        prompt_tokens: tokens in the prompt after the chat template.
        finish_reason: ``eos``, ``stop`` (a stop string), ``length`` (max_new_tokens) or
            ``deadline`` (timeout_s).
        ttft_ms: time to first token (tokenize + prefill + first sample).
        decode_tokens_per_s: tokens per second after the first one (0 when only one).
    """

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    finish_reason: FinishReason
    ttft_ms: float
    decode_tokens_per_s: float


@dataclass
class StreamState:
    """What one generation measured and decided, filled in while it streams."""

    prompt_tokens: int = 0
    finish: FinishReason = "length"
    ttft_s: float = 0.0
    last_s: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.ids: list[int] = []

    def tick(self, started: float) -> None:
        now = time.perf_counter() - started
        if self.count == 0:
            self.ttft_s = now
        self.last_s = now
        self.count += 1

    def decode_rate(self) -> float:
        span = self.last_s - self.ttft_s
        return (self.count - 1) / span if self.count > 1 and span > 0 else 0.0


def first_stop(text: str, stops: Sequence[str], emitted: int) -> int | None:
    """Where the earliest stop string starts in ``text`` (searching from what could still
    hold one), or None."""
    found = [i for s in stops if (i := text.find(s, max(0, emitted - len(s) + 1))) >= 0]
    return min(found) if found else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could begin a stop string (kept unsent)."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if s.startswith(text[-n:]):
                longest = n
                break
    return longest
