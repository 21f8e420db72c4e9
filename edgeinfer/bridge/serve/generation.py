"""Generate requests: several generations at once per model, a bounded queue, streamed chunks.

Each generate model has a lane: a queue of at most ``max_queue`` requests (one more is
answered ``busy``) and ``max_running`` threads. A model loaded with continuous batching decodes
up to its ``max_sequences`` generations together (one graph run per token for all of them);
the lane runs that many at once (a model without it: one). Each thread streams its answer to
the reply topic as
numbered chunks (``{"chunk": 0, "text": ...}``, ``1``, ...) while it is decoded, then sends
one final message (``done: true``) with the full text, token counts, time to first token,
tokens/s and the stop reason: ``eos``, ``stop`` (a stop string), ``length``
(``max_new_tokens``), ``deadline`` (the whole-answer deadline) or ``cancelled``.

Deadlines: a request whose whole-answer deadline or first-token deadline passed in the queue
is answered ``deadline_exceeded`` without running; a first token that comes after its
deadline stops the generation with ``deadline_exceeded``; the whole-answer deadline ends the
generation where it is (``stop_reason: deadline``, the text so far). ``cancel`` by id stops a
queued generation before it runs and a running one at its next token.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from edgeinfer.bridge.serve.replies import DedupStore, Stored
from edgeinfer.bridge.serve.serving import ModelTable
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.failures import wire_error
from edgeinfer.config import SamplingConfig
from edgeinfer.runtime.generate.streaming import first_stop, held_back

__all__ = ["GenerationLane"]

Send = Callable[[proto.Request, bytes], None]


class _Cancelled(Exception):
    """Raised inside a lane when its running generation is cancelled."""


class GenerationLane:
    """Serve one model's generate requests, up to ``max_running`` at once.

    Args:
        name: the model's name (its topic level).
        models: the model table (the lane takes the model when a generation starts).
        dedup: the bridge's de-duplication store (the lane releases its keys).
        send: publishes one payload to a request's reply topic (any thread).
        reply_error: answers a request with an error (and counts it).
        max_queue: generations waiting at most.
        max_running: generations running at most (threads); the model's own
            ``max_sequences`` caps it further.
        clock_ms: epoch-ms clock (deadlines).
        on_answer: called with the model name and the total ms of each final answer.
    """

    def __init__(
        self,
        name: str,
        *,
        models: ModelTable,
        dedup: DedupStore,
        send: Send,
        reply_error: Callable[[proto.Request, str, str], None],
        max_queue: int,
        max_running: int = 1,
        clock_ms: Callable[[], float],
        on_answer: Callable[[str, float], None] | None = None,
    ) -> None:
        self.name = name
        self._on_answer = on_answer
        self._models = models
        self._dedup = dedup
        self._send = send
        self._reply_error = reply_error
        self.max_queue = max_queue
        self._clock = clock_ms
        self._queue: deque[proto.Request] = deque()
        self._cond = threading.Condition()  # guards the queue, _running, _cancel, _stopping
        self._running: set[str] = set()
        self._cancel: set[str] = set()
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
                self._cancel.update([*(r.id for r in self._queue), *self._running])
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

    def submit(self, request: proto.Request) -> bool:
        """Queue a generation; False when the queue is full (the caller answers ``busy``)."""
        with self._cond:
            if len(self._queue) >= self.max_queue or self._stopping:
                return False
            self._queue.append(request)
            self._cond.notify_all()
            return True

    def cancel(self, target: str) -> str:
        """Cancel generation ``target``: ``queued``, ``running`` or ``unknown`` (finished,
        never seen, or on another model)."""
        with self._cond:
            if target in self._running:
                self._cancel.add(target)
                return "running"
            for queued in self._queue:
                if queued.id == target:
                    self._cancel.add(target)
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
                request = self._queue.popleft()
                self._running.add(request.id)
            try:
                self._serve(request)
            except Exception as exc:  # a reply must go out whatever happened; the lane lives
                self._dedup.release(request.key, None)
                self._reply_error(request, *wire_error(exc, request_id=request.id))
            finally:
                with self._cond:
                    self._running.discard(request.id)
                    self._cancel.discard(request.id)
                    self._cond.notify_all()

    def _cancelled(self, request_id: str) -> bool:
        with self._cond:
            return request_id in self._cancel

    def _serve(self, request: proto.Request) -> None:
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
            self._dedup.release(request.key, None)
            self._reply_error(
                request,
                proto.DEADLINE_EXCEEDED,
                f"deadline passed {now - min(late):.1f} ms ago in the queue; the model was not run",
            )
            return
        queue_ms = max(0.0, now - request.received_ms)
        if self._cancelled(request.id):
            self._finish(request, _Answer(reason="cancelled"), queue_ms)
            return
        model = self._models.get(self.name)
        if model is None:
            self._dedup.release(request.key, None)
            self._reply_error(
                request, proto.UNKNOWN_MODEL, f"model {self.name!r} is no longer served"
            )
            return
        answer = self._generate(model, request, given, first_deadline)  # errors: _loop
        if answer.reason == "first_token_deadline":
            self._dedup.release(request.key, None)
            self._reply_error(
                request,
                proto.DEADLINE_EXCEEDED,
                f"the first token took {(answer.first_s or 0.0) * 1e3:.1f} ms, after the "
                "first-token deadline; the generation was stopped",
            )
            return
        self._finish(request, answer, queue_ms)

    def _generate(
        self,
        model: Any,
        request: proto.Request,
        given: kinds.GenerateInput,
        first_deadline: float | None,
    ) -> _Answer:
        answer = _Answer()
        remaining_s = (
            None if request.deadline_ms is None else (request.deadline_ms - self._clock()) / 1e3
        )
        sampling = SamplingConfig(**dict(given.sampling or {}))
        stops = list(given.stop)
        self.generations += 1
        started = time.perf_counter()
        text, emitted = "", 0
        chunks = model.stream(
            given.prompt if isinstance(given.prompt, str) else list(given.prompt),
            max_new_tokens=given.max_new_tokens,
            sampling=sampling,
            timeout_s=remaining_s,
        )
        try:
            for chunk in chunks:
                answer.tokens += len(chunk.token_ids)
                answer.last_s = time.perf_counter() - started
                if answer.first_s is None:
                    answer.first_s = answer.last_s
                    if first_deadline is not None and self._clock() > first_deadline:
                        answer.reason = "first_token_deadline"
                        return answer
                text += chunk.text
                cut = first_stop(text, stops, emitted)
                safe = cut if cut is not None else len(text) - held_back(text, stops)
                if safe > emitted:
                    self._chunk(request, answer, text[emitted:safe])
                    emitted = safe
                if cut is not None:
                    answer.reason, text = "stop", text[:cut]
                    break
                if self._cancelled(request.id):
                    answer.reason = "cancelled"
                    break
        finally:
            chunks.close()  # releases the model for the next generation
        if len(text) > emitted and answer.reason != "stop":
            self._chunk(request, answer, text[emitted:])
        answer.text = text
        if answer.reason is None:
            expired = request.deadline_ms is not None and self._clock() >= request.deadline_ms
            reason = "length" if answer.tokens >= given.max_new_tokens else "eos"
            answer.reason = "deadline" if expired else reason
        return answer

    def _chunk(self, request: proto.Request, answer: _Answer, text: str) -> None:
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
        self._send(request, proto.encode(chunk, fmt=request.fmt))

    def _finish(self, request: proto.Request, answer: _Answer, queue_ms: float) -> None:
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
        stored = Stored(head, proto.Body(result), answer.chunks)
        self._dedup.release(request.key, stored)
        self._send(request, stored.payload(request.fmt))
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
