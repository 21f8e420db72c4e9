"""One generation request apart from the model that decodes it (as onnxruntime-genai keeps its
``Generator`` apart from its ``Model``): the prompt's ids, the sampler, the text stream and
every rule that ends it, in one place.

``accept`` takes each generated token and decides, at that token, whether the sequence is
done and why: ``eos`` (a stop token), ``stop`` (a stop string), ``length`` (max_new_tokens) or
``deadline``. The decision is made once, where it happens, so a length stop is never reported
as a deadline that passed a moment later; ``close`` hands it on in the stream's last chunk.

A sequence the continuous-batching engine decodes hands its tokens to the caller's thread
through a queue: ``tokens()`` or ``chunks()`` block on it; closing either iterator early (or
``cancel()``) frees the sequence's slot at the engine's next step.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Ids
from typing import Any

from edgeinfer.config import SamplingConfig
from edgeinfer.runtime.generate.lookup import PromptLookup
from edgeinfer.runtime.generate.sampling import Sampler
from edgeinfer.runtime.generate.streaming import StreamState, TextChunk, TextStream

__all__ = ["Sequence"]

_DONE = object()  # the queue's last item


class Sequence:
    """A request's decoding state and stop rules.

    Args:
        ids: the prompt's token ids.
        max_new_tokens: tokens to generate at most.
        sampling: greedy or sampled.
        stop_token_ids: tokens that end the sequence (``eos``); empty: none does (benchmarks).
        text: the detokenizer with the stop strings; ``None``: token ids only.
        deadline: a ``time.perf_counter()`` value that ends the sequence (``deadline``).
        started: when the request began (its time to first token counts from here).
        keep_prefix: how many leading prompt ids are worth keeping in the prefix store (a
            chat's system prompt); 0: none.
        clock: the time source of ``deadline`` and ``started`` (``time.perf_counter``).
    """

    def __init__(
        self,
        ids: Ids[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig,
        stop_token_ids: frozenset[int],
        text: TextStream | None = None,
        deadline: float | None = None,
        started: float | None = None,
        keep_prefix: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.ids = list(ids)
        self.clock = clock
        self.max_new_tokens = max_new_tokens
        self.sample = Sampler(sampling)
        self.stop_token_ids = stop_token_ids
        self.text = text
        self.deadline = deadline
        self.started = clock() if started is None else started
        self.state = StreamState(prompt_tokens=len(self.ids))
        self.generated: list[int] = []  # every token accepted (an eos included)
        # The result's token ids: the text's (an eos is never pushed to it), else all of them.
        self.state.ids = text.ids if text is not None else self.generated
        self.done = False
        self.cancelled = threading.Event()
        self.token_s: list[float] = []  # perf_counter of each accepted token, when decoded
        self.keep_prefix = keep_prefix
        # What the engine found when it started the sequence: prompt tokens it did not run
        # (kept by its slot or loaded), of them those loaded from the prefix store.
        self.reused = 0
        self.from_disk = 0
        self.lookup: PromptLookup | None = None  # its prompt lookup, when it drafts
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    @property
    def position(self) -> int:
        """Where the next token fed to the model goes (the last generated one's position)."""
        return len(self.ids) + len(self.generated) - 1

    @property
    def needed_positions(self) -> int:
        """KV positions this sequence may need: prompt, tokens and the graph's spare one."""
        return len(self.ids) + self.max_new_tokens + 1

    def accept(self, token: int) -> TextChunk | None:
        """Record one generated token; the text it makes safe to send. Sets ``done`` (and the
        state's ``finish``) when this token ends the sequence."""
        self.generated.append(token)
        now = self.clock()
        self.state.tick(now - self.started)
        self.token_s.append(now)
        chunk = None
        if token in self.stop_token_ids:
            self.state.finish, self.done = "eos", True
        else:
            if self.text is not None:
                chunk = self.text.push(token)
                if self.text.stopped:
                    self.state.finish, self.done = "stop", True
            if not self.done and len(self.generated) >= self.max_new_tokens:
                self.state.finish, self.done = "length", True
            elif not self.done and self.deadline is not None and now >= self.deadline:
                self.state.finish, self.done = "deadline", True
        return chunk

    def expired(self) -> bool:
        """True (and finished with ``deadline``) when the deadline passed before any token."""
        if self.deadline is not None and self.clock() >= self.deadline:
            self.state.finish, self.done = "deadline", True
        return self.done

    def close(self, decode: Callable[[list[int]], str]) -> TextChunk:
        """The stream's last chunk, carrying the finish reason: what the stream held back (a
        trailing partial character; after a stop string, the tokens no chunk carried); no
        text and no tokens when nothing was held back."""
        last = None
        if self.text is not None:
            stopped = self.text.stopped
            last = self.text.finish("" if stopped else decode(self.text.ids))
            if self.text.stopped and not stopped:  # the whole text holds a stop string
                self.state.finish = "stop"
        if last is None:
            return TextChunk(text="", token_ids=(), finish_reason=self.state.finish)
        return dataclasses.replace(last, finish_reason=self.state.finish)

    # -- the engine's side of the queue --------------------------------------------------------

    def put(self, token: int, chunk: TextChunk | None) -> None:
        self._queue.put((token, chunk))

    def end(self, error: BaseException | None = None, chunk: TextChunk | None = None) -> None:
        """No more tokens: the last chunk, then the end (or the error the engine met)."""
        if chunk is not None:
            self._queue.put((None, chunk))
        self._queue.put(error if error is not None else _DONE)

    # -- the caller's side ---------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop decoding this sequence (its slot is freed at the engine's next step)."""
        self.cancelled.set()

    def _items(self) -> Iterator[tuple[int | None, TextChunk | None]]:
        try:
            while True:
                item = self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()  # a no-op once done; frees the slot of a stream left unfinished

    def __iter__(self) -> Iterator[int]:
        """The generated token ids as the engine decodes them (an eos included)."""
        for token, _ in self._items():
            if token is not None:
                yield token

    def chunks(self) -> Iterator[TextChunk]:
        """The text chunks as they become safe to send."""
        for _, chunk in self._items():
            if chunk is not None:
                yield chunk
