"""The bridge's worker: a bounded queue between paho's network thread and the models.

``submit`` (paho's thread) only does cheap things: answer an error, a repeated id (de-dup
store), a reply-cache hit or an expired deadline; route a generation to its lane
(``generation.py``) or cancel one; enqueue, or answer ``busy`` when the queue is full. Worker
threads drop requests that expired while queued, take the model serving the name *now* (a
deploy swaps models between requests), run it and reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

from edgeinfer.bridge.serve.generation import GenerationLane
from edgeinfer.bridge.serve.replies import (
    DedupStore,
    Outgoing,
    ReplyCache,
    Stored,
    cache_key,
    epoch_ms,
    success_head,
)
from edgeinfer.bridge.serve.serving import (
    ModelTable,
    ServedModel,
    StreamTable,
    kind_of,
    run_request,
)
from edgeinfer.bridge.serve.stats import ModelStats, percentiles
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.failures import wire_error
from edgeinfer.errors import ConfigError
from edgeinfer.runtime.metrics import LatencyWindow

__all__ = ["Outgoing", "ServedModel", "Worker", "epoch_ms"]

log = logging.getLogger(__name__)

# Recent latencies kept for the metrics percentiles: enough for a stable p99, bounded memory.
_LATENCY_WINDOW = 4096


class Worker:
    """Bounded queue, worker threads, generation lanes, deadlines, de-duplication, caching.

    Args:
        models: model name (the topic level) -> model, or a ``ModelTable`` shared with deploy.
        send: publishes one reply; called from paho's thread and from the worker threads.
        max_queue: requests waiting at most; one more is answered ``busy``.
        dedup_size: recent replies kept to answer repeated ids.
        threads: worker threads (1: models run one request at a time, each on every core).
        clock_ms: epoch-ms clock (deadlines are compared with it).
        reply_cache_bytes: answer repeated deterministic requests (same package, same input)
            from memory in paho's thread, up to this many bytes; 0 turns it off.
        max_generate_queue: generations waiting per generate model; one more gets ``busy``.
        max_generations: generations running at once per generate model (a model loaded
            without continuous batching runs one).
        streams: the live device streams of stateful (tensor) models.
    """

    def __init__(
        self,
        models: Mapping[str, ServedModel] | ModelTable,
        *,
        send: Callable[[Outgoing], None],
        max_queue: int = 64,
        dedup_size: int = 4096,
        threads: int = 1,
        clock_ms: Callable[[], float] = epoch_ms,
        reply_cache_bytes: int = 0,
        max_generate_queue: int = 4,
        max_generations: int = 1,
        streams: StreamTable | None = None,
    ) -> None:
        limits = (max_queue, dedup_size, threads, max_generate_queue, max_generations)
        if min(limits) < 1 or reply_cache_bytes < 0:
            raise ConfigError(
                "max_queue, dedup_size, threads, max_generate_queue and max_generations must "
                "each be >= 1, reply_cache_bytes >= 0"
            )
        self.models = models if isinstance(models, ModelTable) else ModelTable(models)
        self._send = send
        self._clock = clock_ms
        self.max_queue = max_queue
        self.max_generate_queue = max_generate_queue
        self.max_generations = max_generations
        self.streams = streams or StreamTable()
        self.dedup = DedupStore(dedup_size)
        self.reply_cache = ReplyCache(reply_cache_bytes) if reply_cache_bytes else None
        self._queue: deque[proto.Request] = deque()
        self._ready = threading.Condition()  # guards _queue, _paused, _stopping, _lanes
        self._paused = False
        self._stopping = False
        self._lanes: dict[str, GenerationLane] = {}
        self._lock = threading.Lock()  # guards counters and latencies
        self.counts: Counter[str] = Counter()
        self._latency: dict[str, LatencyWindow] = {
            k: LatencyWindow(_LATENCY_WINDOW) for k in ("queue_ms", "compute_ms", "total_ms")
        }
        self.model_stats = ModelStats(_LATENCY_WINDOW)
        self._threads = [
            threading.Thread(target=self._loop, name=f"edgeinfer-worker-{i}")
            for i in range(threads)
        ]
        self._started = False

    def start(self) -> None:
        """Start the worker threads and the lanes (once)."""
        with self._ready:
            if self._started:
                return
            self._started = True
            for thread in self._threads:
                thread.start()
            for lane in self._lanes.values():
                lane.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Answer what is queued, then stop; returns only when every thread has ended.

        Queued text/image/tensor requests all run. Generations get ``timeout_s`` to finish
        (queued ones included); those still running then are cancelled at their next token.
        """
        with self._ready:
            self._paused = False
            self._stopping = True
            self._ready.notify_all()
            started, lanes = self._started, list(self._lanes.values())
        if not started:
            return
        for lane in lanes:
            lane.stop(timeout_s=timeout_s)
        for thread in self._threads:
            thread.join()

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
        """Requests waiting in the queue now (generations not included)."""
        with self._ready:
            return len(self._queue)

    def lane(self, name: str) -> GenerationLane:
        """The generation lane of model ``name`` (made on first use)."""
        with self._ready:
            lane = self._lanes.get(name)
            if lane is None:
                lane = self._lanes[name] = GenerationLane(
                    name,
                    models=self.models,
                    dedup=self.dedup,
                    send=self._send_to,
                    reply_error=self._reply_request_error,
                    max_queue=self.max_generate_queue,
                    max_running=self.max_generations,
                    clock_ms=self._clock,
                    on_answer=self.model_stats.record,
                )
                if self._started and not self._stopping:
                    lane.start()
            return lane

    def submit(self, item: proto.Request | proto.ErrorReply) -> None:
        """Answer, route or enqueue one decoded message. Cheap; never runs a model."""
        self._count("received")
        if isinstance(item, proto.ErrorReply):
            self._reply_error(item)
            return
        model = self.models.get(item.model)
        if model is None:
            self._reply_request_error(
                item,
                proto.UNKNOWN_MODEL,
                f"no model {item.model!r} on this bridge; serving {self.models.names()}",
            )
            return
        expected = kind_of(model)
        if item.kind == "cancel" and expected == "generate":
            self._cancel(item)
            return
        if item.kind != expected:
            self._reply_request_error(
                item,
                proto.WRONG_KIND,
                f"{item.model!r} is a {model.task!r} package: it takes {expected!r} requests, "
                f"not {item.kind!r}",
            )
            return
        claim = self.dedup.claim(item.key)
        if isinstance(claim, Stored):
            self._count("duplicate_replayed")
            self._replay(item, claim)
            return
        if not claim:
            self._count("duplicate_dropped")
            return
        try:  # the id is claimed: whatever happens now, release it with one reply
            self._dispatch(item, model)
        except Exception as exc:
            self._fail(item, exc)

    def _dispatch(self, item: proto.Request, model: ServedModel) -> None:
        """Answer a claimed request now (expired, cached), queue it, or answer ``busy``."""
        if item.deadline_ms is not None and self._clock() >= item.deadline_ms:
            self.dedup.release(item.key, None)
            self._reply_expired(item)
            return
        if self._answer_from_cache(item, model):
            return
        if item.kind == "generate":
            queued = not self._stopping and self.lane(item.model).submit(item)
            limit = self.max_generate_queue
        else:
            with self._ready:
                queued = len(self._queue) < self.max_queue and not self._stopping
                if queued:
                    self._queue.append(item)
                    self._ready.notify()
            limit = self.max_queue
        if not queued:
            self.dedup.release(item.key, None)
            self._reply_request_error(
                item, proto.BUSY, f"queue full ({limit} waiting); retry later"
            )

    def _cancel(self, item: proto.Request) -> None:
        target = getattr(item.input, "target", "")
        state = self.lane(item.model).cancel(target)
        self._count("cancel")
        head = {"v": proto.PROTOCOL_VERSION, "id": item.id, "ok": True, "model": item.model}
        body = proto.Body({"cancelled": target, "state": state})
        self._send_to(item, proto.encode_reply(head, body, fmt=item.fmt))

    def _replay(self, item: proto.Request, stored: Stored) -> None:
        """A finished request's reply (a streamed generation's chunks first), to the repeat's
        topic, marked ``"replay": true``."""
        quiet = isinstance(item.input, kinds.GenerateInput) and not item.input.stream
        if not quiet:  # "stream": false asked for the final message only
            for chunk in stored.replayed_chunks():
                self._send_to(item, proto.encode(chunk, fmt=item.fmt))
        self._send_to(item, stored.payload(item.fmt, replay=True))

    def _answer_from_cache(self, item: proto.Request, model: ServedModel) -> bool:
        """Answer a repeated deterministic request from the reply cache; True when it did."""
        if self.reply_cache is None:
            return False
        key = cache_key(str(model.manifest.digest), item)
        hit = None if key is None else self.reply_cache.get(key)
        if hit is None:
            return False
        fields, body = hit
        head = success_head(
            item, fields, cached=True, queue_ms=0.0, compute_ms=0.0, now_ms=self._clock()
        )
        stored = Stored(head, body)
        self.dedup.release(item.key, stored)
        with self._lock:
            self.counts["ok"] += 1
            self.counts["cached"] += 1
            self.counts["reply_cache_hit"] += 1
        self._send_to(item, stored.payload(item.fmt))
        return True

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
            except Exception as exc:  # a reply must go out whatever happened; the thread lives
                self._fail(request, exc)

    def _serve(self, request: proto.Request) -> None:
        started = self._clock()
        if request.deadline_ms is not None and started >= request.deadline_ms:
            self.dedup.release(request.key, None)
            self._reply_expired(request)
            return
        model = self.models.get(request.model)  # taken once: the whole answer is this model's
        if model is None:
            self.dedup.release(request.key, None)
            self._reply_request_error(
                request, proto.UNKNOWN_MODEL, f"model {request.model!r} is no longer served"
            )
            return
        t0 = time.perf_counter()
        outcome = run_request(request.model, model, request, self.streams)
        compute_ms = (time.perf_counter() - t0) * 1e3
        finished = self._clock()
        queue_ms = max(0.0, started - request.received_ms)
        fields = {
            "precision": getattr(model.manifest, "precision", None),
            "exit_layer": outcome.exit_layer,
            **outcome.extra,
        }
        head = success_head(
            request,
            fields,
            cached=outcome.cached,
            queue_ms=queue_ms,
            compute_ms=compute_ms,
            now_ms=self._clock(),
        )
        key = None if self.reply_cache is None else cache_key(str(model.manifest.digest), request)
        if self.reply_cache is not None and key is not None:
            self.reply_cache.put(key, fields, outcome.body)
        with self._lock:
            self.counts["ok"] += 1
            self.counts["cached"] += int(outcome.cached)
            self._latency["queue_ms"].record(queue_ms)
            self._latency["compute_ms"].record(compute_ms)
            self._latency["total_ms"].record(finished - request.received_ms)
        self.model_stats.record(request.model, finished - request.received_ms)
        stored = Stored(head, outcome.body)
        self.dedup.release(request.key, stored)
        self._send_to(request, stored.payload(request.fmt))

    def _fail(self, request: proto.Request, exc: Exception) -> None:
        """Answer ``request`` with the error ``exc`` maps to; its id may be asked again."""
        self.dedup.release(request.key, None)
        code, message = wire_error(exc, request_id=request.id)
        self._reply_request_error(request, code, message)

    def _send_to(self, request: proto.Request, payload: bytes) -> None:
        self._send(Outgoing(request.reply_to, payload, request.correlation, request.fmt))

    def _reply_request_error(self, request: proto.Request, code: str, message: str) -> None:
        self._reply_error(
            proto.ErrorReply(
                code,
                message,
                id=request.id,
                model=request.model,
                reply_to=request.reply_to,
                correlation=request.correlation,
                fmt=request.fmt,
            )
        )

    def _reply_expired(self, request: proto.Request) -> None:
        late_ms = self._clock() - (request.deadline_ms or 0.0)
        self._reply_request_error(
            request,
            proto.DEADLINE_EXCEEDED,
            f"deadline passed {late_ms:.1f} ms ago; the model was not run",
        )

    def _reply_error(self, error: proto.ErrorReply) -> None:
        self._count(f"error.{error.code}")
        payload = proto.encode(error.to_dict(), fmt=error.fmt)
        self._send(Outgoing(error.reply_to, payload, error.correlation, error.fmt))

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def snapshot(self) -> dict[str, Any]:
        """Counters, queue depths and latency percentiles (ms) of the recent window."""
        with self._lock:
            counts = dict(self.counts)
            summaries = {k: v.summary() for k, v in self._latency.items()}
        with self._ready:
            lanes = {name: lane.depth for name, lane in self._lanes.items()}
            queued = Counter(request.model for request in self._queue)  # at most max_queue
        ok = counts.get("ok", 0)
        return {
            "counts": counts,
            "queue_depth": self.queue_depth,
            "max_queue": self.max_queue,
            "generate_queue_depth": lanes,
            "dedup_entries": len(self.dedup),
            "reply_cache_entries": 0 if self.reply_cache is None else len(self.reply_cache),
            "streams": len(self.streams),
            "cache_hit_rate": (counts.get("cached", 0) / ok) if ok else None,
            "latency_ms": {name: percentiles(s) for name, s in summaries.items()},
            "per_model": self.model_stats.snapshot(self.models, queued + Counter(lanes)),
        }
