"""The bridge's worker: a bounded queue between paho's network thread and the models.

``submit`` runs in paho's callback thread and only does cheap things: answer a decode error,
answer a repeated id from the de-duplication store, answer an already-expired deadline, or
enqueue. A full queue is answered ``busy`` at once (back-pressure instead of unbounded memory).
Worker threads take requests off the queue, answer ``deadline_exceeded`` without running the
model when the deadline passed while queued, and otherwise run the model and reply.

De-duplication: the key is ``(model, id)``. A repeat of a request still queued or running is
dropped (its one reply is on the way); a repeat of a finished one is answered from a bounded
LRU of recent replies, re-addressed to the repeat's reply topic and correlation data, without
running the model again. That is what makes QoS 1 redelivery and client re-sends answer once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from edgeinfer.bridge import protocol as proto
from edgeinfer.errors import ConfigError, EdgeInferError, InputError
from edgeinfer.runtime.metrics import LatencyWindow

if TYPE_CHECKING:
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.tasks import ClassificationResult, EmbeddingResult

__all__ = ["Outgoing", "ServedModel", "Worker", "epoch_ms"]

log = logging.getLogger(__name__)

# Recent latencies kept for the metrics percentiles: enough for a stable p99, bounded memory.
_LATENCY_WINDOW = 4096


def epoch_ms() -> float:
    """Wall-clock time in epoch milliseconds (deadlines are absolute epoch ms on the wire)."""
    return time.time() * 1e3


class ServedModel(Protocol):
    """What the bridge needs from a model: ``edgeinfer.Model`` satisfies it."""

    @property
    def task(self) -> str:
        """``embed`` or ``classify``."""

    @property
    def manifest(self) -> Manifest:
        """The package manifest (the bridge reads ``precision``)."""

    def embed_with_info(
        self, texts: Sequence[str], *, truncate: bool = True
    ) -> list[EmbeddingResult]:
        """One embedding per text, each saying whether the result cache answered it."""

    def classify(
        self, texts: Sequence[str], *, truncate: bool = True
    ) -> list[ClassificationResult]:
        """One result per text."""


@dataclass(frozen=True)
class Outgoing:
    """One reply to publish: ``topic`` ``None`` means the request named no reply topic."""

    topic: str | None
    payload: bytes
    correlation: bytes | None
    fmt: str


def _result(model: ServedModel, request: proto.Request) -> tuple[Any, bool, int | None]:
    """Run the model; return (JSON-ready result, cached, exit_layer)."""
    if model.task == "embed":
        answers = model.embed_with_info(list(request.texts), truncate=request.truncate)
        cached = bool(answers) and all(a.cached for a in answers)
        return [a.vector.astype(float).tolist() for a in answers], cached, None
    if model.task == "classify":
        results = model.classify(list(request.texts), truncate=request.truncate)
        layers = [r.exit_layer for r in results]
        items = [{"label": r.label, "score": r.score, "scores": r.scores, "exit_layer": layer}
                 for r, layer in zip(results, layers, strict=True)]
        exits = [layer for layer in layers if layer is not None]
        cached = bool(results) and all(r.cached for r in results)
        return items, cached, (max(exits) if exits else None)
    raise ConfigError(f"the bridge cannot serve a {model.task!r} model")


class _Stored:
    """A finished reply in the de-dup store, with its encoded payload per wire format."""

    __slots__ = ("_payloads", "reply")

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self._payloads: dict[str, bytes] = {}

    def payload(self, fmt: str) -> bytes:
        """The reply encoded as ``fmt`` (encoded once; a duplicate race encodes it twice)."""
        data = self._payloads.get(fmt)
        if data is None:
            data = self._payloads[fmt] = proto.encode(self.reply, fmt=fmt)
        return data


class Worker:
    """Bounded queue, worker threads, deadlines, de-duplication and serving statistics.

    Args:
        models: model name (the topic level) -> model.
        send: publishes one reply; called from paho's thread and from the worker threads.
        max_queue: requests waiting at most; one more is answered ``busy``.
        dedup_size: recent replies kept to answer repeated ids.
        threads: worker threads (1: models run one request at a time, each on every core).
        clock_ms: epoch-ms clock (deadlines are compared with it).
    """

    def __init__(
        self,
        models: Mapping[str, ServedModel],
        *,
        send: Callable[[Outgoing], None],
        max_queue: int = 64,
        dedup_size: int = 4096,
        threads: int = 1,
        clock_ms: Callable[[], float] = epoch_ms,
    ) -> None:
        if max_queue < 1 or dedup_size < 1 or threads < 1:
            raise ConfigError("max_queue, dedup_size and threads must each be >= 1")
        self.models = dict(models)
        self._send = send
        self._clock = clock_ms
        self.max_queue = max_queue
        self._queue: deque[proto.Request] = deque()
        self._ready = threading.Condition()  # guards _queue, _paused and _stopping
        self._paused = False
        self._stopping = False
        self._dedup_size = dedup_size
        # (model, id) -> the reply and its encodings by format (a replay re-encodes nothing)
        self._done: OrderedDict[tuple[str, str], _Stored] = OrderedDict()
        self._pending: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # guards the de-dup store, counters and latencies
        self.counts: Counter[str] = Counter()
        self._latency: dict[str, LatencyWindow] = {
            k: LatencyWindow(_LATENCY_WINDOW) for k in ("queue_ms", "compute_ms", "total_ms")
        }
        self._threads = [
            threading.Thread(target=self._loop, name=f"edgeinfer-worker-{i}", daemon=True)
            for i in range(threads)
        ]
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker threads (once)."""
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Let queued requests finish, then stop the threads."""
        with self._ready:
            self._paused = False
            self._stopping = True
            self._ready.notify_all()
        if self._started:
            for thread in self._threads:
                thread.join(timeout_s)
            self._started = False

    def pause(self) -> None:
        """Stop taking requests off the queue (they wait; new ones still queue or get busy)."""
        with self._ready:
            self._paused = True

    def resume(self) -> None:
        """Take requests off the queue again."""
        with self._ready:
            self._paused = False
            self._ready.notify_all()

    @property
    def queue_depth(self) -> int:
        """Requests waiting in the queue now."""
        with self._ready:
            return len(self._queue)

    # -- paho's thread -----------------------------------------------------------------------
    def submit(self, item: proto.Request | proto.ErrorReply) -> None:
        """Answer or enqueue one decoded message. Cheap; never runs a model."""
        with self._lock:
            self.counts["received"] += 1
        if isinstance(item, proto.ErrorReply):
            self._reply_error(item)
            return
        if item.model not in self.models:
            self._reply_error(self._error_for(item, proto.UNKNOWN_MODEL,
                                              f"no model {item.model!r} on this bridge; "
                                              f"serving {sorted(self.models)}"))
            return
        key = (item.model, item.id)
        with self._lock:
            done = self._done.get(key)
            if done is not None:
                self._done.move_to_end(key)
                self.counts["duplicate_replayed"] += 1
            elif key in self._pending:
                self.counts["duplicate_dropped"] += 1
                return
        if done is not None:
            self._send(Outgoing(item.reply_to, done.payload(item.fmt), item.correlation,
                                item.fmt))
            return
        if item.deadline_ms is not None and self._clock() >= item.deadline_ms:
            self._reply_expired(item)
            return
        with self._ready:
            with self._lock:  # re-checked: submit may be called from more than one thread
                if key in self._pending or key in self._done:
                    self.counts["duplicate_dropped"] += 1
                    return
                queued = len(self._queue) < self.max_queue
                if queued:
                    self._pending.add(key)
            if queued:
                self._queue.append(item)
                self._ready.notify()
        if not queued:
            self._reply_error(self._error_for(
                item, proto.BUSY, f"queue full ({self.max_queue} waiting); retry later"))

    # -- worker threads ----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(
                    lambda: self._stopping or (not self._paused and bool(self._queue))
                )
                if not self._queue:
                    return  # stopping, and nothing left to serve
                request = self._queue.popleft()
            try:
                self._serve(request)
            except Exception:  # a reply must go out whatever happened; the thread must live
                log.exception("failed to serve request %r", request.id)
                self._finish(request, None)
                self._reply_error(self._error_for(request, proto.INTERNAL, "internal error"))

    def _serve(self, request: proto.Request) -> None:
        started = self._clock()
        if request.deadline_ms is not None and started >= request.deadline_ms:
            self._finish(request, None)
            self._reply_expired(request)
            return
        model = self.models[request.model]
        t0 = time.perf_counter()
        try:
            result, cached, exit_layer = _result(model, request)
        except InputError as exc:
            self._finish(request, None)
            self._reply_error(self._error_for(request, proto.BAD_REQUEST, str(exc)))
            return
        except EdgeInferError as exc:
            log.warning("model %s failed on %r: %s", request.model, request.id, exc)
            self._finish(request, None)
            self._reply_error(self._error_for(request, proto.INTERNAL, f"{exc.code}: {exc}"))
            return
        compute_ms = (time.perf_counter() - t0) * 1e3
        finished = self._clock()
        queue_ms = max(0.0, started - request.received_ms)
        reply = {
            "id": request.id,
            "ok": True,
            "model": request.model,
            "precision": getattr(model.manifest, "precision", None),
            "result": result,
            "cached": cached,
            "exit_layer": exit_layer,
            "queue_ms": round(queue_ms, 3),
            "compute_ms": round(compute_ms, 3),
            "slack_ms": (None if request.deadline_ms is None
                         else round(request.deadline_ms - finished, 3)),
        }
        with self._lock:
            self.counts["ok"] += 1
            self.counts["cached"] += int(cached)
            self._latency["queue_ms"].record(queue_ms)
            self._latency["compute_ms"].record(compute_ms)
            self._latency["total_ms"].record(finished - request.received_ms)
        stored = _Stored(reply)
        self._finish(request, stored)
        self._send(Outgoing(request.reply_to, stored.payload(request.fmt), request.correlation,
                            request.fmt))

    def _finish(self, request: proto.Request, reply: _Stored | None) -> None:
        """Move a request from pending to the de-dup store (a failed one is forgotten)."""
        key = (request.model, request.id)
        with self._lock:
            self._pending.discard(key)
            if reply is not None:
                self._done[key] = reply
                self._done.move_to_end(key)
                while len(self._done) > self._dedup_size:
                    self._done.popitem(last=False)

    # -- replies -----------------------------------------------------------------------------
    @staticmethod
    def _error_for(request: proto.Request, code: str, message: str) -> proto.ErrorReply:
        return proto.ErrorReply(code, message, id=request.id, model=request.model,
                                reply_to=request.reply_to, correlation=request.correlation,
                                fmt=request.fmt)

    def _reply_expired(self, request: proto.Request) -> None:
        late_ms = self._clock() - (request.deadline_ms or 0.0)
        error = self._error_for(request, proto.DEADLINE_EXCEEDED,
                                f"deadline passed {late_ms:.1f} ms ago; the model was not run")
        self._reply_error(error)

    def _reply_error(self, error: proto.ErrorReply) -> None:
        with self._lock:
            self.counts[f"error.{error.code}"] += 1
        payload = proto.encode(error.to_dict(), fmt=error.fmt)
        self._send(Outgoing(error.reply_to, payload, error.correlation, error.fmt))

    # -- metrics -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counters, queue depth and latency percentiles (ms) of the recent window."""
        with self._lock:
            counts = dict(self.counts)
            summaries = {k: v.summary() for k, v in self._latency.items()}
            dedup_entries = len(self._done)
        ok = counts.get("ok", 0)
        return {
            "counts": counts,
            "queue_depth": self.queue_depth,
            "max_queue": self.max_queue,
            "dedup_entries": dedup_entries,
            "cache_hit_rate": (counts.get("cached", 0) / ok) if ok else None,
            "latency_ms": {
                name: (
                    {"p50": s.p50_ms, "p95": s.p95_ms, "p99": s.p99_ms} if s.count else
                    {"p50": None, "p95": None, "p99": None}
                )
                for name, s in summaries.items()
            },
        }
