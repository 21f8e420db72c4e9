"""What a generation streams and returns, and the text side of the per-token path: token ids
in, text chunks out. Text is sent only once no stop string can still begin in it.

Per token: one incremental detokenizer step (``LMTokenizer.decode_step``: the new characters,
none while a multi-byte character is incomplete) and a stop-string check over the few characters
not sent yet. The text of the whole answer is never rebuilt while streaming.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    from edgeinfer.config import SamplingConfig
    from edgeinfer.runtime.generate.lm_tokenizer import LMTokenizer

__all__ = [
    "FinishReason",
    "GenerateOptions",
    "GenerationResult",
    "StreamState",
    "TextChunk",
    "TextStream",
    "first_stop",
    "held_back",
]

FinishReason = Literal["eos", "stop", "length", "deadline"]


class GenerateOptions(TypedDict, total=False):
    """The keyword options of ``generate``/``stream``, written once: the model, its typed
    handle and the backend pass them through to ``Generator.generate`` (the defaults and
    their meaning are there)."""

    max_new_tokens: int
    sampling: SamplingConfig | None
    stop: Sequence[str]
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A piece of streamed text: ``text`` is new, complete characters (never half of one);
    ``token_ids`` are the tokens generated since the previous chunk. The stream's last chunk
    carries ``finish_reason`` (``eos``, ``stop``, ``length`` or ``deadline``, decided once, at
    the token that ended the generation); it may hold no text and no tokens. Every other chunk
    has ``None``."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None


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

    def tick(self, elapsed_s: float) -> None:
        """One token, ``elapsed_s`` after the request began."""
        if self.count == 0:
            self.ttft_s = elapsed_s
        self.last_s = elapsed_s
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


class TextStream:
    """Turn generated token ids into ``TextChunk``s, cut at the first stop string.

    Args:
        tokenizer: the package's tokenizer (``lm_tokenizer.LMTokenizer``).
        stops: the stop strings (empty strings ignored).
        live: detokenize as tokens come; False (a whole answer without stop strings) keeps the
            ids only and sends the text at ``finish``.
    """

    def __init__(self, tokenizer: LMTokenizer, stops: Sequence[str], *, live: bool = True) -> None:
        self._step = tokenizer.decode_step()
        self.stops = [s for s in stops if s]
        self.live = live or bool(self.stops)
        self.ids: list[int] = []
        self.sent = 0  # characters sent
        self.stopped = False  # a stop string was found
        self._held = ""  # decoded, not sent: it could begin a stop string
        self._pending = 0  # tokens since the last chunk

    def push(self, token: int) -> TextChunk | None:
        """Add one generated token; the text that is now safe to send, if any."""
        self.ids.append(token)
        self._pending += 1
        if not self.live:
            return None
        piece = self._step(token)
        if piece is None:  # an incomplete character
            return None
        if not self.stops:
            return self._chunk(piece)
        text = self._held + piece
        cut = first_stop(text, self.stops, 0)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return self._chunk(text[:cut]) if cut else None
        safe = len(text) - held_back(text, self.stops)
        self._held = text[safe:]
        return self._chunk(text[:safe]) if safe else None

    def finish(self, text: str) -> TextChunk | None:
        """The last chunk, given ``text``: the whole answer decoded at once (it ends with any
        character the stream could not complete); once a stop string ended the text, only
        the tokens no chunk carried yet."""
        if self.stopped:
            return self._chunk("") if self._pending else None
        tail = first_stop(text, self.stops, self.sent)
        self.stopped = tail is not None
        end = len(text) if tail is None else tail
        if end > self.sent or self._pending:
            return self._chunk(text[self.sent : max(end, self.sent)])
        return None

    def _chunk(self, text: str) -> TextChunk:
        tokens = tuple(self.ids[len(self.ids) - self._pending :]) if self._pending else ()
        self.sent += len(text)
        self._pending = 0
        return TextChunk(text=text, token_ids=tokens)
