"""Generate requests: several generations at once per model, a bounded queue, streamed chunks.

Each generate model has a lane: a fair queue of at most ``max_queue`` requests, taken round
robin across clients (``fairness.py``: one more is answered ``busy``, or pushes out the newest
of the client holding the most), and ``max_running`` threads. A model loaded with continuous
batching decodes up to its ``max_sequences`` generations together (one graph run per token for
all of them); the lane runs that many at once (a model without it: one). Each thread streams
its answer to the reply topic as numbered chunks (``{"chunk": 0, "text": ...}``, ``1``, ...)
while it is decoded, then sends one final message (``done: true``) with the full text, token
counts, time to first token, tokens/s and the stop reason: ``eos``, ``stop`` (a stop string),
``length`` (``max_new_tokens``), ``deadline`` (the whole-answer deadline) or ``cancelled``.

Deadlines: a request whose whole-answer deadline or first-token deadline passed in the queue
is answered ``deadline_exceeded`` without running; a first token that comes after its
deadline stops the generation with ``deadline_exceeded``; the whole-answer deadline ends the
generation where it is (``stop_reason: deadline``, the text so far). The runtime decides every
stop reason but ``cancelled`` once, at the token that ended the generation, and the stream's
last chunk carries it: the lane passes ``stop=`` and the deadline down and reads it. ``cancel``
by id stops a queued generation of the same client (reply address) before it runs and a
running one at its next token (closing its stream); another client's generation of that id is
not touched. Every reply goes through the request's ``Ticket`` (``guard.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from edgeinfer.bridge.models import ModelTable
from edgeinfer.bridge.serve.fairness import FairQueue, enqueue
from edgeinfer.bridge.serve.guard import Hold, Ticket
from edgeinfer.bridge.serve.replies import Stored
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.config import SamplingConfig
from edgeinfer.errors import InferenceError

__all__ = ["GenerationLane"]


class GenerationLane:
    """Serve one model's generate requests, up to ``max_running`` at once.

    Args:
        name: the model's name (its topic level).
        models: the model table (the lane takes the model when a generation starts).
        max_queue: generations waiting at most.
        max_running: generations running at most (threads); the model's own
            ``max_sequences`` caps it further.
        max_client: generations one reply address may have in flight; ``None``: no cap.
        clock_ms: epoch-ms clock (deadlines).
        on_answer: called with the model name and the total ms of each final answer.
    """

    def __init__(
        self,
        name: str,
        *,
        models: ModelTable,
        max_queue: int,
        max_running: int = 1,
        max_client: int | None = None,
        clock_ms: Callable[[], float],
        on_answer: Callable[[str, float], None] | None = None,
    ) -> None:
        self.name = name
        self._on_answer = on_answer
        self._models = models
        self.max_queue = max_queue
        self._clock = clock_ms
        self._queue: FairQueue[Ticket] = FairQueue(max_queue, max_client=max_client)
        self._cond = threading.Condition()  # guards the queue, _running, _cancel, _stopping
        self._running: set[proto.RequestKey] = set()
        self._cancel: set[proto.RequestKey] = set()
        self._stopping = False
        self.generations = 0  # model runs started (the soak test checks one per id)
        self._threads = [
            threading.Thread(target=self._loop, name=f"edgeinfer-gen-{name}-{i}")
            for i in range(max_running)
        ]

    def start(self) -> None:
        """Start the lane's threads."""
        for thread in self._threads:
            thread.start()

    def stop(self, *, timeout_s: float) -> None:
        """Finish queued generations for up to ``timeout_s``, cancel the rest, join."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: not self._queue and not self._running, timeout_s):
                self._cancel.update([*(t.request.key for t in self._queue), *self._running])
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    @property
    def depth(self) -> int:
        """Generations waiting now."""
        with self._cond:
            return len(self._queue)

    @property
    def running(self) -> int:
        """Generations running now."""
        with self._cond:
            return len(self._running)

    def _capacity(self) -> int:
        """How many generations may run now: the threads, capped by the model's slots."""
        model = self._models.get(self.name)
        return min(len(self._threads), int(getattr(model, "max_sequences", 1)))

    def submit(self, ticket: Ticket, hold: Hold) -> None:
        """Queue a generation and pass its ticket on, or answer it ``busy``."""
        enqueue(self._queue, self._cond, ticket, hold, closed=lambda: self._stopping)

    def cancel(self, key: proto.RequestKey) -> str:
        """Cancel the generation of identity ``key``: ``queued``, ``running`` or ``unknown``
        (finished, never seen, another client's, or on another model)."""
        with self._cond:
            if key in self._running:
                self._cancel.add(key)
                return "running"
            if any(queued.request.key == key for queued in self._queue):
                self._cancel.add(key)
                self._cond.notify_all()
                return "queued"
        return "unknown"

    # -- the lane's thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        (self._stopping and not self._queue)
                        or (bool(self._queue) and len(self._running) < self._capacity())
                    )
                )
                if not self._queue:
                    return
                ticket = self._queue.pop()
                key = ticket.request.key
                self._running.add(key)
            try:
                with ticket.hold():  # a reply goes out whatever happens; the lane lives on
                    self._serve(ticket)
            finally:
                with self._cond:
                    self._running.discard(key)
                    self._cancel.discard(key)
                    self._cond.notify_all()

    def _cancelled(self, key: proto.RequestKey) -> bool:
        with self._cond:
            return key in self._cancel

    def _serve(self, ticket: Ticket) -> None:
        request = ticket.request
        given = request.input
        assert isinstance(given, kinds.GenerateInput)  # the worker routes only generate here
        now = self._clock()
        first_deadline = (
            None
            if given.first_token_timeout_ms is None
            else request.received_ms + given.first_token_timeout_ms
        )
        late = [d for d in (request.deadline_ms, first_deadline) if d is not None and now >= d]
        if late:
            ticket.fail(
                proto.DEADLINE_EXCEEDED,
                f"deadline passed {now - min(late):.1f} ms ago in the queue; the model was not run",
            )
            return
        queue_ms = max(0.0, now - request.received_ms)
        if self._cancelled(request.key):
            self._finish(ticket, _Answer(reason="cancelled"), queue_ms)
            return
        model = self._models.get(self.name)
        if model is None:
            ticket.fail(proto.UNKNOWN_MODEL, f"model {self.name!r} is no longer served")
            return
        answer = self._generate(model, ticket, given, first_deadline)  # errors: the hold
        if answer.reason == "first_token_deadline":
            ticket.fail(
                proto.DEADLINE_EXCEEDED,
                f"the first token took {(answer.first_s or 0.0) * 1e3:.1f} ms, after the "
                "first-token deadline; the generation was stopped",
            )
            return
        self._finish(ticket, answer, queue_ms)

    def _generate(
        self,
        model: Any,
        ticket: Ticket,
        given: kinds.GenerateInput,
        first_deadline: float | None,
    ) -> _Answer:
        """Stream the model's answer out as chunks. The runtime cuts the stop strings, keeps
        the whole-answer deadline and decides the finish reason once, on the last chunk; the
        bridge keeps the first-token deadline and cancels by closing the stream."""
        request = ticket.request
        answer = _Answer()
        remaining_s = (
            None if request.deadline_ms is None else (request.deadline_ms - self._clock()) / 1e3
        )
        self.generations += 1
        started = time.perf_counter()
        chunks = model.stream(
            given.prompt if isinstance(given.prompt, str) else list(given.prompt),
            max_new_tokens=given.max_new_tokens,
            sampling=SamplingConfig(**dict(given.sampling or {})),
            stop=list(given.stop),
            timeout_s=None if remaining_s is None else max(remaining_s, 0.0),
        )
        texts: list[str] = []
        try:
            for chunk in chunks:
                if chunk.token_ids:
                    answer.tokens += len(chunk.token_ids)
                    answer.last_s = time.perf_counter() - started
                if answer.first_s is None and chunk.token_ids:
                    answer.first_s = answer.last_s
                    if first_deadline is not None and self._clock() > first_deadline:
                        answer.reason = "first_token_deadline"
                        return answer
                if chunk.text:
                    texts.append(chunk.text)
                    self._chunk(ticket, answer, chunk.text)
                answer.reason = chunk.finish_reason
                if answer.reason is not None:
                    break
                if self._cancelled(request.key):
                    answer.reason = "cancelled"
                    break
        finally:
            chunks.close()  # cancels the sequence when it has not ended; frees its slot
        if answer.reason is None:
            raise InferenceError("the model's stream ended without a finish reason")
        answer.text = "".join(texts)
        return answer

    def _chunk(self, ticket: Ticket, answer: _Answer, text: str) -> None:
        request = ticket.request
        if isinstance(request.input, kinds.GenerateInput) and not request.input.stream:
            return  # "stream": false: the final message carries the whole text
        chunk = {
            "v": proto.PROTOCOL_VERSION,
            "id": request.id,
            "model": request.model,
            "chunk": len(answer.chunks),
            "text": text,
        }
        answer.chunks.append(chunk)
        ticket.chunk(proto.encode(chunk, fmt=request.fmt))

    def _finish(self, ticket: Ticket, answer: _Answer, queue_ms: float) -> None:
        request = ticket.request
        model = self._models.get(self.name)
        head = {
            "v": proto.PROTOCOL_VERSION,
            "id": request.id,
            "ok": True,
            "done": True,
            "model": request.model,
            "precision": getattr(getattr(model, "manifest", None), "precision", None),
            "queue_ms": round(queue_ms, 3),
            "compute_ms": round(answer.last_s * 1e3, 3),
        }
        result = {
            "text": answer.text,
            "chunks": len(answer.chunks),
            "completion_tokens": answer.tokens,
            "ttft_ms": None if answer.first_s is None else round(answer.first_s * 1e3, 3),
            "tokens_per_s": round(answer.rate(), 3),
            "stop_reason": answer.reason,
        }
        hint = _empty_answer_hint(request.input, model, answer)
        if hint is not None:
            result["hint"] = hint
        ticket.answer(Stored(head, proto.Body(result), answer.chunks))
        if self._on_answer is not None:
            self._on_answer(self.name, self._clock() - request.received_ms)


def _empty_answer_hint(given: kinds.Input, model: Any, answer: _Answer) -> str | None:
    """Why a plain prompt to a chat model may have ended at once, and what to send instead."""
    io = getattr(getattr(model, "manifest", None), "io", None)
    plain = isinstance(given, kinds.GenerateInput) and isinstance(given.prompt, str)
    ended_at_once = answer.tokens == 0 and answer.reason == "eos"
    if not ended_at_once or not plain or getattr(io, "chat_format", None) is None:
        return None
    return (
        "no tokens: this package is a chat model, and a plain 'prompt' is continued as raw "
        "text (an instruct model often ends it at once); send 'messages', or add \"chat\": true"
    )


class _Answer:
    """What one generation produced and measured (times in s from its start)."""

    def __init__(self, *, reason: str | None = None) -> None:
        self.reason = reason
        self.text = ""
        self.tokens = 0
        self.first_s: float | None = None
        self.last_s = 0.0
        self.chunks: list[dict[str, Any]] = []

    def rate(self) -> float:
        """Decode tokens per second after the first token (0 with fewer than two)."""
        span = self.last_s - (self.first_s or 0.0)
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else 0.0
