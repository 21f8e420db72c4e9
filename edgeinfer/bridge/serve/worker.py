"""The bridge's worker: a bounded queue between paho's network thread and the models.

``submit`` (paho's thread) only does cheap things: answer an error, a re-send (de-dup store),
an id reused for other content, a reply-cache hit or an expired deadline; route a generation to
its lane (``generation.py``) or cancel one of the same client's; enqueue, fairly across clients
(``fairness.py``), or answer ``busy``. Worker threads drop requests that expired while queued,
take the model serving the name *now* (a deploy swaps models between requests), run it and
reply. Every reply leaves through the request's ``Ticket`` (``guard.py``): exactly one final.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from edgeinfer.bridge.models import ModelTable, ServedModel
from edgeinfer.bridge.serve.fairness import FairQueue, enqueue
from edgeinfer.bridge.serve.generation import GenerationLane
from edgeinfer.bridge.serve.guard import Hold, Ticket, error_outgoing
from edgeinfer.bridge.serve.replies import (
    PENDING,
    REUSED,
    DedupStore,
    Outgoing,
    ReplyCache,
    Stored,
    cache_key,
    content_digest,
    epoch_ms,
    success_head,
)
from edgeinfer.bridge.serve.serving import StreamTable, kind_of, run_deadline_s, run_request
from edgeinfer.bridge.serve.stats import ModelStats, percentiles
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import ConfigError
from edgeinfer.runtime.metrics import LatencyWindow
from edgeinfer.runtime.watchdog import deadline

__all__ = ["Outgoing", "ServedModel", "Worker", "epoch_ms"]

log = logging.getLogger(__name__)

# Recent latencies kept for the metrics percentiles: enough for a stable p99, bounded memory.
_LATENCY_WINDOW = 4096


class Worker:
    """Fair bounded queue, worker threads, generation lanes, deadlines, de-duplication, caching.

    Args:
        models: model name (the topic level) -> model, or a ``ModelTable`` shared with deploy.
        send: publishes one reply; called from paho's thread and from the worker threads.
        max_queue: requests waiting at most; one more is answered ``busy`` (or pushes out the
            newest of the client holding the most of the queue, ``fairness.py``).
        dedup_size: recent replies kept to answer repeated ids.
        threads: worker threads (1: models run one request at a time, each on every core).
        clock_ms: epoch-ms clock (deadlines are compared with it).
        reply_cache_bytes: answer repeated deterministic requests (same package, same input)
            from memory in paho's thread, up to this many bytes; 0 turns it off.
        max_generate_queue: generations waiting per generate model; one more gets ``busy``.
        max_generations: generations running at once per generate model (a model loaded
            without continuous batching runs one).
        streams: the live device streams of stateful (tensor) models.
        max_client_requests: text/image/tensor requests one reply address may have in flight
            (queued or running); ``None``: no cap (the fair queue alone keeps others served).
        max_client_generations: generations one reply address may have in flight per
            generate model; ``None``: no cap.
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
        max_client_requests: int | None = None,
        max_client_generations: int | None = None,
    ) -> None:
        caps = [c for c in (max_client_requests, max_client_generations) if c is not None]
        limits = (max_queue, dedup_size, threads, max_generate_queue, max_generations, *caps)
        if min(limits) < 1 or reply_cache_bytes < 0:
            raise ConfigError(
                "max_queue, dedup_size, threads, max_generate_queue, max_generations and the "
                "per-client caps must each be >= 1, reply_cache_bytes >= 0"
            )
        self.models = models if isinstance(models, ModelTable) else ModelTable(models)
        self._send = send
        self._clock = clock_ms
        self.max_queue = max_queue
        self.max_generate_queue = max_generate_queue
        self.max_generations = max_generations
        self.max_client_generations = max_client_generations
        self.streams = streams or StreamTable()
        self.dedup = DedupStore(dedup_size)
        self.reply_cache = ReplyCache(reply_cache_bytes) if reply_cache_bytes else None
        self._queue: FairQueue[Ticket] = FairQueue(max_queue, max_client=max_client_requests)
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
                    max_queue=self.max_generate_queue,
                    max_running=self.max_generations,
                    max_client=self.max_client_generations,
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
            self._count(f"error.{item.code}")
            self._send(error_outgoing(item, key=None))
            return
        ticket = Ticket(item, send=self._send, count=self._count)
        with ticket.hold() as hold:
            self._take(ticket, hold)

    def _take(self, ticket: Ticket, hold: Hold) -> None:
        """Answer a request now (error, re-send, cached, expired), or pass it on to a queue."""
        item = ticket.request
        model = self.models.get(item.model)
        if model is None:
            names = self.models.names()
            message = f"no model {item.model!r} on this bridge; serving {names}"
            ticket.fail(proto.UNKNOWN_MODEL, message)
            return
        expected = kind_of(model)
        if item.kind == "cancel" and expected == "generate":
            self._cancel(ticket)
            return
        if item.kind != expected:
            ticket.fail(
                proto.WRONG_KIND,
                f"{item.model!r} is a {model.task!r} package: it takes {expected!r} requests, "
                f"not {item.kind!r}",
            )
            return
        content = content_digest(item)
        claim = ticket.claim(self.dedup, content)
        if isinstance(claim, Stored):
            self._count("duplicate_replayed")
            quiet = isinstance(item.input, kinds.GenerateInput) and not item.input.stream
            ticket.replay(claim, chunks=not quiet)  # "stream": false: the final message only
            return
        if claim == PENDING:
            self._count("duplicate_dropped")
            hold.pass_on()  # a re-send of a request still pending: the first's reply answers it
            return
        if claim == REUSED:
            ticket.fail(
                proto.ID_REUSED,
                f"id {item.id!r} was already used for a different request from this reply "
                "address; send each new request with a fresh id",
            )
            return
        if item.deadline_ms is not None and self._clock() >= item.deadline_ms:
            self._fail_expired(ticket)
            return
        if self._answer_from_cache(ticket, model, content):
            return
        if item.kind == "generate":
            self.lane(item.model).submit(ticket, hold)
            return
        enqueue(self._queue, self._ready, ticket, hold, closed=lambda: self._stopping)

    def _cancel(self, ticket: Ticket) -> None:
        """Cancel a generation of the same client (reply address): another's is ``unknown``."""
        item = ticket.request
        target = getattr(item.input, "target", "")
        state = self.lane(item.model).cancel((item.reply_to or "", item.model, target))
        self._count("cancel")
        head = {"v": proto.PROTOCOL_VERSION, "id": item.id, "ok": True, "model": item.model}
        ticket.answer(Stored(head, proto.Body({"cancelled": target, "state": state})))

    def _answer_from_cache(self, ticket: Ticket, model: ServedModel, content: bytes) -> bool:
        """Answer a repeated deterministic request from the reply cache; True when it did."""
        if self.reply_cache is None:
            return False
        item = ticket.request
        key = cache_key(str(model.manifest.digest), item, content)
        hit = None if key is None else self.reply_cache.get(key)
        if hit is None:
            return False
        fields, body = hit
        head = success_head(
            item, fields, cached=True, queue_ms=0.0, compute_ms=0.0, now_ms=self._clock()
        )
        with self._lock:
            self.counts["ok"] += 1
            self.counts["cached"] += 1
            self.counts["reply_cache_hit"] += 1
        ticket.answer(Stored(head, body))
        return True

    def _loop(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(
                    lambda: self._stopping or (not self._paused and bool(self._queue))
                )
                if not self._queue:
                    return  # stopping, and nothing left to serve
                ticket = self._queue.pop()
            with ticket.hold():  # a reply goes out whatever happens; the thread lives on
                self._serve(ticket)

    def _serve(self, ticket: Ticket) -> None:
        request = ticket.request
        started = self._clock()
        if request.deadline_ms is not None and started >= request.deadline_ms:
            self._fail_expired(ticket)
            return
        model = self.models.get(request.model)  # taken once: the whole answer is this model's
        if model is None:
            ticket.fail(proto.UNKNOWN_MODEL, f"model {request.model!r} is no longer served")
            return
        t0 = time.perf_counter()
        with deadline(at_s=run_deadline_s(request.deadline_ms, now_ms=started)):  # stops a run
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
        if self.reply_cache is not None and ticket.digest is not None:
            key = cache_key(str(model.manifest.digest), request, ticket.digest)
            if key is not None:
                self.reply_cache.put(key, fields, outcome.body)
        with self._lock:
            self.counts["ok"] += 1
            self.counts["cached"] += int(outcome.cached)
            self._latency["queue_ms"].record(queue_ms)
            self._latency["compute_ms"].record(compute_ms)
            self._latency["total_ms"].record(finished - request.received_ms)
        self.model_stats.record(request.model, finished - request.received_ms)
        ticket.answer(Stored(head, outcome.body))

    def _fail_expired(self, ticket: Ticket) -> None:
        """Drop a request whose deadline (or v5 Message Expiry) passed before it started:
        counted ``expired``, answered ``deadline_exceeded``, never run, never a late ``ok``."""
        self._count("expired")
        late_ms = self._clock() - (ticket.request.deadline_ms or 0.0)
        ticket.fail(
            proto.DEADLINE_EXCEEDED, f"deadline passed {late_ms:.1f} ms ago; the model was not run"
        )

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
            queued = Counter(t.request.model for t in self._queue)  # at most max_queue
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
