"""QoS 1 that holds across a crash: requests go through the journal (``journal.py``).

``accept`` (paho's thread) queues a QoS 1 request's row for the journal's thread and hands the
request to the worker at once, so the model runs while the row is written; no PUBACK leaves
before every row queued ahead of it is committed (``acknowledge``; a recorded request's own
goes with its row) — a group commit: one transaction and one fsync for all the rows that came
meanwhile. A reply of a request whose row is not committed yet is held and published by the
journal's thread right after the commit: nothing leaves for a request the broker could still
redeliver to a bridge that has no row of it. A bridge killed before the commit never
acknowledged the request (the broker delivers it again) and never answered it; one killed after
has the row (the next start runs it again). Without the journal's thread running (``start``),
``accept`` records before it returns.

A duplicate of a pending request goes to the worker, whose store drops it (its one answer is on
the way) or replays the answer it just gave; a duplicate of an answered one is answered from
the journal (``"replay": true``; an answer that was an error runs it again, as the in-memory
store does). A broker's redelivery (DUP: our PUBACK never reached it, say the bridge was killed
between the commit and the PUBACK) of a pending or answered request is dropped: the client sent
it once, and its one answer went or goes out (a client's re-send of the id gets the replay).
``restart`` re-submits what a killed bridge had recorded but not answered; one
re-run ``max_starts`` times without an answer (it may be what kills the bridge) is answered
``internal`` instead, and one whose v5 message expiry passed ``deadline_exceeded``. A row that
cannot be written (a full or broken disk) is logged; its request is answered unjournaled.

A request is answered in the journal when the broker has acknowledged its final reply
(``published``, from paho's ``on_publish``), not when paho was handed it: a bridge killed
with the reply still in paho's queue runs the request again at the next start, so the reply
is not lost; the price is a second answer if the kill falls between the broker's PUBACK and
the journal's commit (microseconds). Answers are committed by the journal's thread, in batches,
with the rows.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, cast

from edgeinfer.bridge.serve.journal import Answer, Inbound, Journal
from edgeinfer.bridge.serve.replies import Outgoing, content_digest
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto

__all__ = ["Delivery"]

log = logging.getLogger(__name__)

Key = proto.RequestKey  # opaque here: the journal keeps it as a list of strings
Publish = Callable[[], int]  # publishes one reply, returns its mid


class _Live:
    """A recorded, unanswered request: its chunks sent so far and, until its row is committed,
    its replies held back (each with the call that publishes it)."""

    __slots__ = ("chunks", "held", "recorded")

    def __init__(self, *, recorded: bool) -> None:
        self.chunks: list[bytes] = []
        self.held: list[tuple[Outgoing, Publish]] = []
        self.recorded = recorded


class _Queued(NamedTuple):
    """A PUBACK to send once every row queued before it is committed, with the ``row`` (its
    request's key and message) to commit first when it is a request to record."""

    mid: int
    qos: int
    row: tuple[Key, Inbound] | None = None


class Delivery:
    """Accept, replay and re-submit QoS 1 requests through ``journal``; mark them answered.

    Args:
        journal: the durable journal; ``None``: requests go straight to ``submit``.
        decode: decodes a request message (``intake.decode``).
        submit: hands a decoded message to the worker (``Worker.submit``).
        send: publishes one reply (the bridge's send path, which calls ``sending``).
        ack: acknowledges a message to the broker (``mid``, ``qos``: paho's manual ack).
        clock_ms: epoch-ms clock (message expiry, answer times, pruning).
        keep_s: answered requests are forgotten after this long.
        keep_answers: at most this many answered requests are kept.
        max_starts: bridge starts that may re-run one request before it is refused.
    """

    def __init__(
        self,
        journal: Journal | None,
        *,
        decode: Callable[[Inbound], proto.Request | proto.ErrorReply],
        submit: Callable[[proto.Request | proto.ErrorReply], None],
        send: Callable[[Outgoing], None],
        ack: Callable[[int, int], object] = lambda mid, qos: None,
        clock_ms: Callable[[], float],
        keep_s: float,
        keep_answers: int,
        max_starts: int = 3,
    ) -> None:
        self.journal = journal
        self._decode = decode
        self._submit = submit
        self._send = send
        self._ack = ack
        self._clock = clock_ms
        self.keep_s = keep_s
        self.keep_answers = keep_answers
        self.max_starts = max_starts
        self._lock = threading.Lock()  # guards _live, _awaiting, _queue and _uncommitted
        self._live: dict[Key, _Live] = {}  # recorded (or being recorded), unanswered
        self._queue: deque[_Queued] = deque()  # for the journal's thread, in arrival order
        self._uncommitted = 0  # rows queued or being committed
        self._owned: set[int] = set()  # mids of queued rows: the journal's thread acknowledges
        self._committing = False  # a batch is being committed and acknowledged
        self._settled = threading.Condition(self._lock)  # notified after each batch
        self._awaiting: dict[int, tuple[Key, Answer]] = {}  # mid of a final reply -> answer
        self._acked: deque[int] = deque()  # PUBACKed mids not yet looked at
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="edgeinfer-journal", daemon=True)
        names = ("recorded", "replayed", "answered", "expired", "redelivery_dropped")
        self.counts = dict.fromkeys(names, 0)

    # -- requests coming in (paho's thread) ---------------------------------------------------
    def accept(self, inbound: Inbound, decoded: proto.Request | proto.ErrorReply, qos: int) -> None:
        """Queue a QoS 1 request's row (recorded before returning when the journal's thread is
        not running), or answer a duplicate; then hand it on. A message that did not decode,
        or a QoS 0 one, goes on unrecorded."""
        if self.journal is None or qos < 1 or isinstance(decoded, proto.ErrorReply):
            self._submit(decoded)
            return
        key = decoded.key
        with self._lock:
            running = key in self._live
        known = True if running else self.journal.lookup(key)
        answered = isinstance(known, Answer) and _succeeded(known)
        if inbound.redelivered and (known is True or answered):
            self.counts["redelivery_dropped"] += 1  # the one answer went, or goes, out
            return
        if known is True:  # running (the worker has it, re-submitted at start if need be)
            self._submit(decoded)  # so the worker's store drops it, or replays its answer
            return
        if isinstance(known, Answer) and answered:
            if self._reused(decoded):
                message = (
                    f"id {decoded.id!r} was already used for a different request from this "
                    "reply address; send each new request with a fresh id"
                )
                self._send_error(decoded.error(proto.ID_REUSED, message), None)
                return
            self.counts["replayed"] += 1
            self._replay(decoded, known)
            return
        if self._thread.is_alive():
            with self._lock:
                self._live[key] = _Live(recorded=False)
                self._queue.append(_Queued(inbound.mid, qos, (key, inbound)))
                self._owned.add(inbound.mid)
                self._uncommitted += 1
            self._wake.set()
        else:
            self._record_now(key, inbound)
        self._submit(decoded)

    def _record_now(self, key: Key, inbound: Inbound) -> None:
        assert self.journal is not None  # only with a journal
        with self._lock:
            self._live[key] = _Live(recorded=True)
        try:
            self.journal.record(key, inbound)
        except BaseException:
            with self._lock:
                del self._live[key]
            raise
        self.counts["recorded"] += 1

    def acknowledge(self, mid: int, qos: int) -> None:
        """Acknowledge message ``mid`` (paho's thread, once it is handled; QoS 0: nothing to
        do): now, or after the commit of every row queued before it (in order)."""
        if qos < 1:
            return
        with self._lock:
            if mid in self._owned:  # the journal's thread acknowledges it with its row
                self._owned.discard(mid)
                return
            later = self._uncommitted > 0
            if later:
                self._queue.append(_Queued(mid, qos))
        if later:
            self._wake.set()
        else:
            self._ack(mid, qos)

    def _reused(self, request: proto.Request) -> bool:
        """Whether the answered request under ``request``'s identity asked something else."""
        assert self.journal is not None  # only asked with a journal
        original = self.journal.original(request.key)
        first = None if original is None else self._decode(original)
        if not isinstance(first, proto.Request):
            return False
        return content_digest(first) != content_digest(request)

    def restart(self) -> int:
        """Re-submit what was recorded and not answered before this start; returns how many."""
        if self.journal is None:
            return 0
        self.journal.prune(before_ms=self._clock() - self.keep_s * 1e3, keep=self.keep_answers)
        pending = self.journal.restart()
        for entry in pending:
            key = cast(Key, entry.key)
            with self._lock:
                self._live[key] = _Live(recorded=True)
            decoded = self._decode(entry.inbound)
            expires = entry.inbound.expires_ms
            if isinstance(decoded, proto.ErrorReply):  # it decoded once; a newer bridge may not
                self._send_error(decoded, key)
            elif entry.starts >= self.max_starts:
                message = (
                    f"the bridge restarted {entry.starts} times while running this request "
                    "(it may be what stops it); it is not run again"
                )
                self._send_error(decoded.error(proto.INTERNAL, message), key)
            elif expires is not None and self._clock() >= expires:
                self.counts["expired"] += 1
                message = "the message expired while the bridge was down; the model was not run"
                self._send_error(decoded.error(proto.DEADLINE_EXCEEDED, message), key)
            else:
                self._submit(decoded)
        if pending:
            log.info("re-submitted %d request(s) recorded before the last stop", len(pending))
        return len(pending)

    def _send_error(self, error: proto.ErrorReply, key: Key | None) -> None:
        payload = proto.encode(error.to_dict(), fmt=error.fmt)
        self._send(Outgoing(error.reply_to, payload, error.correlation, error.fmt, key, True))

    def _replay(self, request: proto.Request, answer: Answer) -> None:
        """The journal's answer again, in the duplicate's format, each message marked replay."""
        quiet = isinstance(request.input, kinds.GenerateInput) and not request.input.stream
        messages = ([] if quiet else list(answer.chunks)) + [answer.final]
        for i, payload in enumerate(messages):
            reply = {**proto.decode_reply(payload, fmt=answer.fmt), "replay": True}
            out = proto.encode(reply, fmt=request.fmt)
            last = i == len(messages) - 1
            topic, correlation = request.reply_to, request.correlation
            self._send(Outgoing(topic, out, correlation, request.fmt, None, last))

    # -- replies going out (any thread) -------------------------------------------------------
    def sending(self, out: Outgoing, publish: Publish) -> None:
        """Publish ``out`` with ``publish`` (returns the mid) and follow it when it is a reply
        of a recorded request; hold it while the request's row is not committed. Publishes
        are serialized here so that a PUBACK is looked at only once its mid is known (paho
        may take it before ``publish`` returns)."""
        with self._lock:
            live = None if out.key is None else self._live.get(out.key)
            if live is None:
                publish()
            elif not live.recorded:
                live.held.append((out, publish))
            else:
                self._follow(live, out, publish)

    def _follow(self, live: _Live, out: Outgoing, publish: Publish) -> None:
        """Publish a recorded request's reply; its final one awaits the broker's PUBACK."""
        if not out.final:
            live.chunks.append(out.payload)
            publish()
            return
        assert out.key is not None  # a recorded request's reply has its key
        del self._live[out.key]
        answer = Answer(out.fmt, out.payload, tuple(live.chunks))
        self._awaiting[publish()] = (out.key, answer)

    def published(self, mid: int) -> None:
        """paho's ``on_publish``: the broker acknowledged message ``mid`` (network thread)."""
        self._acked.append(mid)
        self._wake.set()

    # -- the thread that commits answers ------------------------------------------------------
    def start(self) -> None:
        """Start committing answers (with a journal)."""
        if self.journal is not None:
            self._thread.start()

    def settle(self, *, timeout_s: float) -> bool:
        """Wait until every queued row is committed (its held replies published); False when
        ``timeout_s`` passed first. A stopping bridge calls it before it disconnects."""
        with self._settled:
            idle = self._settled.wait_for(
                lambda: self._uncommitted == 0 and not self._committing, timeout_s
            )
            return bool(idle)

    def stop(self) -> None:
        """Commit the answers acknowledged so far and close the journal."""
        if self.journal is None:
            return
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._commit()
        self.journal.close()

    def _loop(self) -> None:
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()
            try:
                self._commit()
            except Exception:  # the thread must live: the next commit retries nothing lost
                log.exception("could not mark answers in the journal")

    def _commit(self) -> None:
        """Take what is queued and the acknowledged answers, write them (``_write``), then
        wake those waiting to ``settle``."""
        answers: list[tuple[Key, Answer]] = []
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            self._committing = True
            while self._acked:
                entry = self._awaiting.pop(self._acked.popleft(), None)
                if entry is not None:
                    answers.append(entry)
        try:
            self._write(batch, answers)
        finally:
            with self._lock:
                self._committing = False
                self._settled.notify_all()

    def _write(self, batch: list[_Queued], answers: list[tuple[Key, Answer]]) -> None:
        """Commit the rows and answers in one transaction, publish the replies held for those
        rows, then send the acknowledgements queued behind them."""
        assert self.journal is not None  # the thread runs only with a journal
        if not batch and not answers:
            return
        rows = [queued.row for queued in batch if queued.row is not None]
        try:
            self.journal.commit(records=rows, answers=answers, now_ms=self._clock())
            written = True
        except Exception:  # a full or broken disk: answer anyway, unjournaled
            log.exception("could not write %d request(s) to the journal", len(rows))
            written, answers = False, []
        with self._lock:
            for key, _ in rows:
                self._recorded(key, written=written)
            self._uncommitted -= len(rows)
        self.counts["recorded"] += len(rows) if written else 0
        for queued in batch:  # in arrival order
            self._ack(queued.mid, queued.qos)
        self._answered(len(answers))

    def _recorded(self, key: Key, *, written: bool) -> None:
        """``key``'s row is committed (or could not be): publish the replies held for it."""
        live = self._live.get(key)
        if live is None:
            return
        live.recorded = True
        if not written:
            del self._live[key]  # not in the journal: its replies go out unfollowed
        held, live.held = live.held, []
        for out, publish in held:
            try:
                if written:
                    self._follow(live, out, publish)
                else:
                    publish()
            except (ValueError, TypeError) as exc:  # paho refuses the topic or the size
                log.error("could not publish a %d-byte reply: %s", len(out.payload), exc)

    def _answered(self, answered: int) -> None:
        """Count answers marked; bound the file now and then."""
        if not answered:
            return
        assert self.journal is not None  # only with a journal
        before = self.counts["answered"]
        self.counts["answered"] += answered
        if before // 256 != self.counts["answered"] // 256:
            self.journal.prune(before_ms=self._clock() - self.keep_s * 1e3, keep=self.keep_answers)

    def snapshot(self) -> dict[str, Any]:
        """Counters and what is in flight (for the metrics)."""
        with self._lock:
            live, awaiting = len(self._live), len(self._awaiting)
        return {**self.counts, "in_flight": live, "awaiting_puback": awaiting}


def _succeeded(answer: Answer) -> bool:
    """Whether a journaled final reply was a success (an error one lets the id run again)."""
    try:
        return bool(proto.decode_reply(answer.final, fmt=answer.fmt).get("ok"))
    except ValueError:
        return False
