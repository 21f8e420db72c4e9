"""Fair queues: waiting requests per client (reply address), taken round robin.

One queue per bridge (text, image, tensor requests) and one per generate model hold at most
``max_items`` together. A client is its reply address: each client reads only its own reply
topic, so it is what tells devices apart. Taking round robin means a client with one request
waits behind at most one request of every other client, however many a flooding one queued.
A full queue makes room for a client holding fewer than the client holding the most: that
one's newest request is pushed out (answered ``busy``), so a flood fills the queue only while
no one else is asking. ``max_client`` (optional) caps one client's requests in flight (queued
or running); one more is refused (``busy``) even when the bridge is idle.

``FairQueue`` is not thread-safe: its owner (the worker, a lane) holds its lock around every
call; ``enqueue`` does, and answers what is not queued.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

from edgeinfer.bridge.serve.guard import Hold, Ticket
from edgeinfer.bridge.wire import protocol as proto

__all__ = ["Admission", "FairQueue", "enqueue"]

T = TypeVar("T")


class Admission(NamedTuple, Generic[T]):
    """What ``push`` did: ``queued`` or not (``capped``: the client's cap refused it), and
    the item it pushed out to make room."""

    queued: bool
    pushed_out: T | None = None
    capped: bool = False


class FairQueue(Generic[T]):
    """Items per client, round robin; ``max_items`` in all, ``max_client`` in flight each."""

    def __init__(self, max_items: int, *, max_client: int | None = None) -> None:
        self.max_items = max_items
        self.max_client = max_client
        self._clients: OrderedDict[str, deque[T]] = OrderedDict()  # next to serve first
        self._inflight: Counter[str] = Counter()
        self._length = 0

    def push(self, client: str, item: T) -> Admission[T]:
        """Queue ``item`` of ``client`` (with a cap: in flight until ``done(client)``), pushing
        out the longest client's newest item when full; not queued: the caller answers
        ``busy``."""
        cap = self.max_client
        if cap is not None and self._inflight[client] >= cap:
            return _CAPPED
        pushed_out = None
        if self._length >= self.max_items:
            mine = len(self._clients.get(client, ()))
            longest = max(self._clients, key=lambda c: len(self._clients[c]), default=None)
            if longest is None or len(self._clients[longest]) <= mine + 1:
                return _REFUSED  # no one holds more than its fair share
            pushed_out = self._clients[longest].pop()
            self._length -= 1
        waiting = self._clients.get(client)
        if waiting is None:
            waiting = self._clients[client] = deque()
        waiting.append(item)
        self._length += 1
        if cap is not None:
            self._inflight[client] += 1
        return Admission(True, pushed_out) if pushed_out is not None else _QUEUED

    def pop(self) -> T:
        """The next item, round robin over the clients (``IndexError`` when empty)."""
        client, waiting = next(iter(self._clients.items()))
        item = waiting.popleft()
        self._length -= 1
        if waiting:
            self._clients.move_to_end(client)
        else:
            del self._clients[client]
        return item

    def done(self, client: str) -> None:
        """One of ``client``'s items is answered: it is no longer in flight (with a cap)."""
        left = self._inflight[client] - 1
        if left > 0:
            self._inflight[client] = left
        else:
            del self._inflight[client]

    def __len__(self) -> int:
        return self._length

    def __bool__(self) -> bool:
        return self._length > 0

    def __iter__(self) -> Iterator[T]:
        for waiting in self._clients.values():
            yield from waiting


def enqueue(
    queue: FairQueue[Ticket],
    cond: threading.Condition,
    ticket: Ticket,
    hold: Hold,
    *,
    closed: Callable[[], bool],
) -> None:
    """Queue ``ticket`` (under ``cond``, waking its takers) and pass it on; else answer it
    ``busy``. A ticket pushed out to make room is answered ``busy`` too."""
    client = ticket.client
    with cond:
        admission: Admission[Ticket] = _REFUSED if closed() else queue.push(client, ticket)
        if admission.queued:
            hold.pass_on()
            if queue.max_client is not None:  # counted in flight: uncounted when answered
                ticket.on_final(lambda: _finished(queue, cond, client))  # no taker yet
            cond.notify_all()
    if admission.pushed_out is not None:
        admission.pushed_out.fail(
            proto.BUSY,
            f"pushed out of the full queue ({queue.max_items} waiting): this reply address "
            "held the most of it while another client asked; retry later",
        )
    if admission.capped:
        ticket.fail(
            proto.BUSY,
            f"this reply address has {queue.max_client} requests in flight, its limit; "
            "retry when one is answered",
        )
    elif not admission.queued:
        ticket.fail(proto.BUSY, f"queue full ({queue.max_items} waiting); retry later")


_QUEUED: Admission[Any] = Admission(True)
_REFUSED: Admission[Any] = Admission(False)
_CAPPED: Admission[Any] = Admission(False, capped=True)


def _finished(queue: FairQueue[Ticket], cond: threading.Condition, client: str) -> None:
    with cond:
        queue.done(client)
