"""What the bridge remembers about answers: the de-duplication store and the exact reply cache.

``DedupStore`` keys a request's identity, ``(reply address, model, id)``, and keeps each one's
content digest (``content_digest``: the kind and the whole input). A repeat with the same digest
is a re-send: dropped while the first is pending (its one reply is on the way), answered from a
bounded LRU of recent replies — a generation's chunks included — once it finished, without
running the model again. That is what makes QoS 1 redelivery and client re-sends answer once.
The same identity with another digest is another request under a used id: it is refused
(``id_reused``), never answered with the first one's reply. Another client's request with the
same id has another identity, so it never meets this one's answer.

``ReplyCache`` keys a digest of (package digest, the request's content digest): a deterministic
request seen before is answered in paho's thread from the stored result, without the worker
hop, the model, or re-encoding the result (``protocol.Body`` keeps its bytes).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

import numpy as np

from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto

__all__ = [
    "PENDING",
    "REUSED",
    "RUN",
    "Claim",
    "DedupStore",
    "Outgoing",
    "ReplyCache",
    "Stored",
    "cache_key",
    "content_digest",
    "epoch_ms",
    "success_head",
]


def epoch_ms() -> float:
    """Wall-clock time in epoch milliseconds (deadlines are absolute epoch ms on the wire)."""
    return time.time() * 1e3


class Outgoing(NamedTuple):
    """One reply to publish: ``topic`` ``None`` means the request named no reply topic.
    (A named tuple: one is made per reply and per chunk, a third of a frozen dataclass's
    cost.)

    ``key`` is the identity of the request it answers (``None``: a message that could not be
    decoded into one); ``final`` is True for the one reply that ends the request (an answer,
    an error, a replay), False for a generation's streamed chunks.
    """

    topic: str | None
    payload: bytes
    correlation: bytes | None
    fmt: str
    key: proto.RequestKey | None
    final: bool


class Stored:
    """A finished reply: its head fields, its result body, and (generate) its chunks."""

    __slots__ = ("_payloads", "body", "chunks", "head")

    def __init__(
        self,
        head: dict[str, Any],
        body: proto.Body | None = None,
        chunks: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.head = head
        self.body = body
        self.chunks = tuple(chunks)
        self._payloads: dict[tuple[str, bool], bytes] = {}

    def payload(self, fmt: str, *, replay: bool = False) -> bytes:
        """The reply encoded as ``fmt`` (once; a duplicate race encodes it twice); ``replay``
        marks it ``"replay": true``, a repeat answered from the store."""
        data = self._payloads.get((fmt, replay))
        if data is None:
            head = {**self.head, "replay": True} if replay else self.head
            data = (
                proto.encode(head, fmt=fmt)
                if self.body is None
                else proto.encode_reply(head, self.body, fmt=fmt)
            )
            self._payloads[(fmt, replay)] = data
        return data

    def replayed_chunks(self) -> list[dict[str, Any]]:
        """A generation's chunks again, each marked ``"replay": true``."""
        return [{**chunk, "replay": True} for chunk in self.chunks]


# What ``DedupStore.claim`` says about a request (a finished one's ``Stored`` reply otherwise).
RUN: Final = "run"  # the identity is now pending: run it, then release it with its reply
PENDING: Final = "pending"  # a re-send of a request still pending: drop it
REUSED: Final = "reused"  # the identity is known with other content: refuse it
Claim = Stored | Literal["run", "pending", "reused"]


class DedupStore:
    """Pending identities and an LRU of finished replies (``size`` at most), each with its
    content digest. Thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._done: OrderedDict[proto.RequestKey, tuple[bytes, Stored]] = OrderedDict()
        self._pending: dict[proto.RequestKey, bytes] = {}
        self._lock = threading.Lock()

    def claim(self, key: proto.RequestKey, digest: bytes) -> Claim:
        """The stored reply of a finished re-send; else ``RUN`` (``key`` is now pending),
        ``PENDING`` (a re-send of a pending one) or ``REUSED`` (other content under ``key``)."""
        with self._lock:
            done = self._done.get(key)
            if done is not None:
                if done[0] != digest:
                    return REUSED
                self._done.move_to_end(key)
                return done[1]
            pending = self._pending.get(key)
            if pending is not None:
                return PENDING if pending == digest else REUSED
            self._pending[key] = digest
            return RUN

    def release(self, key: proto.RequestKey, reply: Stored | None) -> None:
        """``key`` is no longer pending; keep its reply (``None``: forget it, e.g. ``busy``)."""
        with self._lock:
            digest = self._pending.pop(key, None)
            if reply is not None and digest is not None:
                self._done[key] = (digest, reply)
                self._done.move_to_end(key)
                while len(self._done) > self.size:
                    self._done.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)


def _update_input(h: Any, given: kinds.Input) -> None:
    """Feed a request's whole input to the hash ``h`` (types and shapes delimit the bytes)."""
    if isinstance(given, kinds.TextInput):  # a tuple's repr delimits its strings
        h.update(repr((given.truncate, given.texts)).encode())
    elif isinstance(given, kinds.ImageInput):
        for image in given.images:
            if isinstance(image, np.ndarray):
                h.update(f"raw:{image.shape}".encode() + image.tobytes())
            else:
                h.update(f"{image[0]}:{len(image[1])}".encode() + image[1])
    elif isinstance(given, kinds.TensorInput):
        h.update(json.dumps(given.stream).encode())
        for name in sorted(given.feeds):
            array = given.feeds[name]
            h.update(f"{name}:{array.dtype.str}:{array.shape}".encode() + array.tobytes())
    elif isinstance(given, kinds.GenerateInput):
        fields = [
            given.prompt,
            given.max_new_tokens,
            given.sampling,
            given.stop,
            given.first_token_timeout_ms,
            given.stream,
        ]
        h.update(json.dumps(fields, sort_keys=True).encode())
    else:
        h.update(json.dumps(given.target).encode())


def content_digest(request: proto.Request) -> bytes:
    """What a request asks, as a digest: its kind, vector encoding and whole input (not its
    id, deadline or reply address). A re-send has the same one."""
    h = hashlib.sha256(f"{request.kind}\0{request.encoding}\0".encode())
    _update_input(h, request.input)
    return h.digest()


def cache_key(digest: str, request: proto.Request, content: bytes) -> bytes | None:
    """The reply-cache key of a deterministic request with ``content_digest`` ``content`` on
    the package of ``digest``, or ``None`` (generate, a stream, cancel)."""
    given = request.input
    stream = isinstance(given, kinds.TensorInput) and given.stream is not None
    if stream or not isinstance(given, kinds.TextInput | kinds.ImageInput | kinds.TensorInput):
        return None
    return hashlib.sha256(digest.encode() + b"\0" + content).digest()


class ReplyCache:
    """Results of deterministic requests by ``cache_key``, at most ``capacity_bytes``. LRU."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, tuple[dict[str, Any], proto.Body, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> tuple[dict[str, Any], proto.Body] | None:
        """The stored (head fields to reuse, result body), or ``None``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0], entry[1]

    def put(self, key: bytes, fields: dict[str, Any], body: proto.Body) -> None:
        """Keep a result (a body larger than the whole cache is not kept)."""
        size = body.nbytes + 256  # the key, the head fields and the entry's own overhead
        if size > self.capacity_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            self._entries[key] = (fields, body, size)
            self._bytes += size
            while self._bytes > self.capacity_bytes:
                _, (_, _, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def success_head(
    request: proto.Request,
    fields: Mapping[str, Any],
    *,
    cached: bool,
    queue_ms: float,
    compute_ms: float,
    now_ms: float,
) -> dict[str, Any]:
    """A success reply's fields (``result`` is spliced in after them); ``slack_ms`` is what
    was left of the deadline at ``now_ms``."""
    deadline = request.deadline_ms
    return {
        "v": proto.PROTOCOL_VERSION,
        "id": request.id,
        "ok": True,
        "model": request.model,
        **fields,
        "cached": cached,
        "queue_ms": round(queue_ms, 3),
        "compute_ms": round(compute_ms, 3),
        "slack_ms": None if deadline is None else round(deadline - now_ms, 3),
    }
