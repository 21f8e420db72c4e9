"""The one reply guard: every request leaves the bridge through exactly one final reply.

A request the worker takes becomes a ``Ticket``, the only way its replies go out: any number of
``chunk`` (a generation's streamed pieces), then exactly one final reply, ``answer`` (a result,
kept in the de-duplication store for re-sends), ``replay`` (a re-send answered from the store)
or ``fail`` (an error; the store forgets the identity, so it may be asked again). The final
reply releases the identity the ticket claimed, then runs the ticket's ``on_final`` callbacks
(a fair queue's per-client count). A second final reply is a bug: it is logged, never sent.

Each stage holding a ticket (paho's thread, a worker thread, a generation lane) runs inside
``with ticket.hold() as hold:``. Leaving it by an exception answers the error it maps to
(``wire_error``); leaving it without a final reply and without ``hold.pass_on()`` (the ticket
was queued for the next stage) answers ``internal``. So no path leaves a client waiting.
Messages that never became a request (undecodable) leave through ``error_outgoing``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from edgeinfer.bridge.serve.replies import RUN, Claim, DedupStore, Outgoing, Stored
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.failures import wire_error

__all__ = ["Hold", "Ticket", "error_outgoing"]

log = logging.getLogger(__name__)

Send = Callable[[Outgoing], None]


def error_outgoing(error: proto.ErrorReply, *, key: proto.RequestKey | None) -> Outgoing:
    """The one reply to a message answered with ``error`` (``key``: its identity, if any)."""
    payload = proto.encode(error.to_dict(), fmt=error.fmt)
    return Outgoing(error.reply_to, payload, error.correlation, error.fmt, key, True)


class Ticket:
    """One request on its way through the bridge; its replies go out only through here.

    Args:
        request: the decoded request.
        send: publishes one reply (any thread).
        count: counts a named event (``error.CODE`` for each error reply).
    """

    __slots__ = ("_callbacks", "_count", "_done", "_lock", "_send", "_store", "digest", "request")

    def __init__(self, request: proto.Request, *, send: Send, count: Callable[[str], None]) -> None:
        self.request = request
        self._send = send
        self._count = count
        self._store: DedupStore | None = None
        self.digest: bytes | None = None  # the content digest, once claimed
        self._done = False
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    @property
    def client(self) -> str:
        """The reply address: the client fair queues and per-client caps count by."""
        return self.request.reply_to or ""

    @property
    def done(self) -> bool:
        """Whether the final reply has gone out."""
        return self._done

    def claim(self, store: DedupStore, digest: bytes) -> Claim:
        """Claim the request's identity in ``store``; on ``RUN`` the final reply releases it."""
        claim = store.claim(self.request.key, digest)
        if claim == RUN:
            self._store, self.digest = store, digest
        return claim

    def on_final(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once, after the final reply (at once if it already went)."""
        with self._lock:
            if not self._done:
                self._callbacks.append(callback)
                return
        callback()

    def hold(self) -> Hold:
        """A stage's hold on the ticket (``with``): answers the request if the stage does not."""
        return Hold(self)

    # -- replies ---------------------------------------------------------------------------
    def chunk(self, payload: bytes) -> None:
        """Publish a streamed chunk (before the final reply; one after it is dropped)."""
        if self._done:
            log.error("a chunk of %r after its final reply was dropped", self.request.id)
            return
        self._publish(payload, final=False)

    def answer(self, stored: Stored) -> None:
        """The final reply: a result, kept for re-sends of this identity."""
        self._final(stored, stored.payload(self.request.fmt))

    def replay(self, stored: Stored, *, chunks: bool) -> None:
        """The final reply to a re-send: ``stored`` (its chunks first when ``chunks``), each
        marked ``"replay": true``."""
        fmt = self.request.fmt
        if chunks and not self._done:
            for chunk in stored.replayed_chunks():
                self._publish(proto.encode(chunk, fmt=fmt), final=False)
        self._final(None, stored.payload(fmt, replay=True))

    def fail(self, code: str, message: str) -> None:
        """The final reply: the error ``code``; the identity is forgotten (ask it again)."""
        request = self.request
        error = request.error(code, message)
        if self._take_final():
            self._count(f"error.{code}")
            self._end(None, error_outgoing(error, key=request.key))

    def fail_with(self, exc: Exception) -> None:
        """The final reply: the error ``exc`` maps to (``wire_error``)."""
        self.fail(*wire_error(exc, request_id=self.request.id))

    def _final(self, kept: Stored | None, payload: bytes) -> None:
        if self._take_final():
            request = self.request
            out = Outgoing(
                request.reply_to, payload, request.correlation, request.fmt, request.key, True
            )
            self._end(kept, out)

    def _take_final(self) -> bool:
        with self._lock:
            if self._done:
                log.error("a second final reply to %r was not sent (a bug)", self.request.id)
                return False
            self._done = True
            return True

    def _end(self, kept: Stored | None, out: Outgoing) -> None:
        """Release the identity (keeping ``kept``) before publishing, so a re-send that comes
        right after the reply finds it; then the callbacks, even if publishing failed."""
        if self._store is not None:
            self._store.release(self.request.key, kept)
        try:
            self._send(out)
        finally:  # no callback is added once done is set (on_final then runs it at once)
            for callback in self._callbacks:
                callback()

    def _publish(self, payload: bytes, *, final: bool) -> None:
        r = self.request
        self._send(Outgoing(r.reply_to, payload, r.correlation, r.fmt, r.key, final))


class Hold:
    """One stage's hold on a ticket (see the module docstring)."""

    __slots__ = ("_passed", "ticket")

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self._passed = False

    def pass_on(self) -> None:
        """The ticket was queued for the next stage, which replies (this one must not)."""
        self._passed = True

    def __enter__(self) -> Hold:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        ticket = self.ticket
        if isinstance(exc, Exception):
            if not ticket.done:
                ticket.fail_with(exc)
            else:
                log.error("request %r failed after its reply", ticket.request.id, exc_info=exc)
            return True  # answered: the stage's thread lives on
        if exc is None and not self._passed and not ticket.done:
            log.error("request %r was left without a reply (a bug)", ticket.request.id)
            ticket.fail(proto.INTERNAL, "the bridge ended this request without an answer")
        return False
