"""The bridge's durable journal: each QoS 1 request recorded before the broker is told it
arrived, and its final reply once the broker has that.

A request is acknowledged (PUBACK) only after its row is committed, so a bridge killed at any
moment either never acknowledged it (the broker delivers it again) or has it here (the next
start runs it again). Once the broker has acknowledged the request's final reply, the row holds
that reply (and a generation's chunks): a redelivered or re-sent duplicate is answered from here,
marked ``"replay": true``, and never run twice — across restarts too.

SQLite in WAL mode. A commit that records requests runs at ``synchronous=FULL``: it fsyncs the
WAL, so a recorded row survives ``kill -9`` and a power cut alike. A commit that only marks
answers runs at ``NORMAL`` (no fsync of its own): it survives ``kill -9``, and the next
recording commit's fsync makes it durable with it; a power cut in between may lose the marks,
and then those requests run again at the next start (answered at least once, never lost).
The two kinds go through two writing connections, one per setting (switching one connection's
setting was two more statements a request); the lock that serializes them keeps them from
waiting on each other. ``commit`` writes several rows and answers in one transaction (one
fsync for all: the delivery's group commit); a lone row or mark is one statement, its own
transaction. A commit appends one WAL frame per page changed; SQLite rather than
an append-only file of our own because it also gives the lookups, the pruning and crash-safe
compaction (checkpoints) without code of ours. Lookups read through a second connection, so a
reader never waits for a writer's fsync (WAL readers see the last commit). ``durable=False``
drops the fsync (tests of other things, and a measurement of what the fsync costs).
"""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError

__all__ = ["Answer", "Inbound", "Journal", "Pending"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    key TEXT PRIMARY KEY,          -- the request identity, a JSON list of strings
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    properties TEXT NOT NULL,      -- the v5 properties needed to answer it, JSON
    received_ms REAL NOT NULL,
    starts INTEGER NOT NULL DEFAULT 0,  -- bridge starts that re-submitted it unanswered
    answered_ms REAL,              -- NULL while pending
    fmt TEXT,
    final BLOB,
    chunks BLOB
);
CREATE INDEX IF NOT EXISTS answered ON requests (answered_ms) WHERE answered_ms IS NOT NULL;
"""
_LENGTH = struct.Struct(">I")
_json_string = json.encoder.encode_basestring_ascii  # a str as JSON text, ASCII-only
_RECORD = (
    "INSERT OR REPLACE INTO requests (key, topic, payload, properties, received_ms) "
    "VALUES (?, ?, ?, ?, ?)"
)
_MARK = (
    "UPDATE requests SET answered_ms = ?, fmt = ?, final = ?, chunks = ? "
    "WHERE key = ? AND answered_ms IS NULL"
)


@dataclass(frozen=True)
class Inbound:
    """One request message as it came off the wire: enough to decode and answer it again.
    ``mid`` (its packet id, for the PUBACK) and ``redelivered`` (the broker sent it before:
    MQTT's DUP flag, our PUBACK never reached it) are this delivery's, not kept in the journal."""

    topic: str
    payload: bytes
    response_topic: str | None = None
    correlation: bytes | None = None
    content_type: str | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    message_expiry_s: int | None = None
    received_ms: float = 0.0
    mid: int = 0
    redelivered: bool = False

    @classmethod
    def of(cls, message: Any, *, received_ms: float) -> Inbound:
        """From a paho ``MQTTMessage`` (its v5 properties, where it has them)."""
        props = getattr(message, "properties", None)
        correlation = getattr(props, "CorrelationData", None)
        users = getattr(props, "UserProperty", None) or ()
        expiry = getattr(props, "MessageExpiryInterval", None)
        return cls(
            topic=message.topic,
            payload=bytes(message.payload),
            response_topic=getattr(props, "ResponseTopic", None) or None,
            correlation=None if correlation is None else bytes(correlation),
            content_type=getattr(props, "ContentType", None),
            user_properties=tuple((str(k), str(v)) for k, v in users),
            message_expiry_s=None if expiry is None else int(expiry),
            received_ms=received_ms,
            mid=int(getattr(message, "mid", 0)),
            redelivered=bool(getattr(message, "dup", False)),
        )

    @property
    def expires_ms(self) -> float | None:
        """When the message's v5 Message Expiry Interval runs out (epoch ms), or ``None``."""
        if self.message_expiry_s is None:
            return None
        return self.received_ms + self.message_expiry_s * 1e3

    def _properties_json(self) -> str:
        return json.dumps(
            {
                "response_topic": self.response_topic,
                "correlation": None if self.correlation is None else self.correlation.hex(),
                "content_type": self.content_type,
                "user_properties": [list(p) for p in self.user_properties],
                "message_expiry_s": self.message_expiry_s,
            }
        )

    @classmethod
    def _from_row(cls, topic: str, payload: bytes, props: str, received_ms: float) -> Inbound:
        data = json.loads(props)
        correlation = data["correlation"]
        return cls(
            topic=topic,
            payload=bytes(payload),
            response_topic=data["response_topic"],
            correlation=None if correlation is None else bytes.fromhex(correlation),
            content_type=data["content_type"],
            user_properties=tuple((str(k), str(v)) for k, v in data["user_properties"]),
            message_expiry_s=data["message_expiry_s"],
            received_ms=received_ms,
        )


@dataclass(frozen=True)
class Answer:
    """A request's final reply as published (``fmt`` is its wire format), after its chunks."""

    fmt: str
    final: bytes
    chunks: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Pending:
    """A recorded request with no answer yet; ``starts``: bridge starts that re-ran it before."""

    key: tuple[str, ...]
    inbound: Inbound
    starts: int


def _key_text(key: Sequence[str]) -> str:
    """``json.dumps(list(key))``, its strings written by json's own C escaper: without the
    encoder json.dumps builds at each call (three keys a request)."""
    return "[" + ", ".join(map(_json_string, key)) + "]"


def _pack(chunks: Iterable[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(c)) + c for c in chunks)


def _unpack(blob: bytes | None) -> tuple[bytes, ...]:
    chunks, at = [], 0
    data = blob or b""
    while at < len(data):
        (size,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        chunks.append(bytes(data[at : at + size]))
        at += size
    return tuple(chunks)


class Journal:
    """Recorded requests and their final replies in one SQLite file. Thread-safe.

    Args:
        path: the database file (its folder is made); one bridge client id per file.
        durable: fsync every commit (``synchronous=FULL``); False: ``NORMAL`` (a commit
            survives the process being killed, not a power cut).

    Raises:
        ConfigError: the file cannot be opened or is not a journal.
    """

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._connect("FULL" if durable else "NORMAL")  # records (and the rest)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            self._marks = self._connect("NORMAL")  # commits that only mark answers
            self._reads = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"cannot open the bridge's request journal {path}: {exc}; give a writable "
                "folder (BridgeConfig.journal_dir), or move the broken file away"
            ) from exc
        self._lock = threading.Lock()  # the writing connections
        self._read_lock = threading.Lock()  # the reading one

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        """A writing connection whose commits fsync (``FULL``) or not (``NORMAL``)."""
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute(f"PRAGMA synchronous={synchronous}")
        return db

    def lookup(self, key: Sequence[str]) -> Answer | bool | None:
        """``key``'s final reply when answered, True while it is pending, ``None`` if unknown."""
        with self._read_lock:
            row = self._reads.execute(
                "SELECT answered_ms, fmt, final, chunks FROM requests WHERE key = ?",
                (_key_text(key),),
            ).fetchone()
        if row is None:
            return None
        if row[0] is None:
            return True
        return Answer(row[1], bytes(row[2]), _unpack(row[3]))

    def original(self, key: Sequence[str]) -> Inbound | None:
        """The message recorded under ``key`` (what it asked), or ``None``."""
        with self._read_lock:
            row = self._reads.execute(
                "SELECT topic, payload, properties, received_ms FROM requests WHERE key = ?",
                (_key_text(key),),
            ).fetchone()
        return None if row is None else Inbound._from_row(*row)

    def record(self, key: Sequence[str], inbound: Inbound) -> None:
        """Keep ``key`` as pending (replacing an earlier answer); returns once it is durable."""
        self.commit(records=[(key, inbound)], answers=(), now_ms=0.0)

    def answer(self, answers: Sequence[tuple[Sequence[str], Answer]], *, now_ms: float) -> None:
        """Mark pending keys answered with their replies, in one commit (an answered key keeps
        its first answer; an unknown one is ignored)."""
        self.commit(records=(), answers=answers, now_ms=now_ms)

    def commit(
        self,
        *,
        records: Sequence[tuple[Sequence[str], Inbound]],
        answers: Sequence[tuple[Sequence[str], Answer]],
        now_ms: float,
    ) -> None:
        """``record`` each of ``records`` and ``answer`` ``answers`` (at ``now_ms``) in one
        transaction; returns once the records are durable (one fsync for all of them)."""
        if not records and not answers:
            return
        rows = [
            (_key_text(k), i.topic, i.payload, i._properties_json(), i.received_ms)
            for k, i in records
        ]
        marks = [(now_ms, a.fmt, a.final, _pack(a.chunks), _key_text(k)) for k, a in answers]
        db = self._db if rows else self._marks
        with self._lock:
            if len(rows) + len(marks) == 1:  # one statement: its own transaction
                db.execute(*((_RECORD, rows[0]) if rows else (_MARK, marks[0])))
                return
            db.execute("BEGIN IMMEDIATE")
            try:
                if rows:
                    db.executemany(_RECORD, rows)
                if marks:
                    db.executemany(_MARK, marks)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def restart(self) -> list[Pending]:
        """Every pending request, oldest first, each counted as re-run once more (one commit)."""
        with self._lock:  # on the FULL connection: the count must hold (it stops a crash loop)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "UPDATE requests SET starts = starts + 1 WHERE answered_ms IS NULL"
                )
                rows = self._db.execute(
                    "SELECT key, topic, payload, properties, received_ms, starts - 1 "
                    "FROM requests WHERE answered_ms IS NULL ORDER BY received_ms"
                ).fetchall()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return [
            Pending(tuple(json.loads(k)), Inbound._from_row(t, p, props, r), starts)
            for k, t, p, props, r, starts in rows
        ]

    def prune(self, *, before_ms: float, keep: int) -> int:
        """Forget answered requests answered before ``before_ms``, and all but the ``keep``
        most recent answered ones; returns how many went. Pending ones always stay."""
        with self._lock:  # no fsync of its own: rows a power cut brings back are pruned again
            cursor = self._marks.execute(
                "DELETE FROM requests WHERE answered_ms IS NOT NULL AND (answered_ms < ? OR "
                "key IN (SELECT key FROM requests WHERE answered_ms IS NOT NULL "
                "ORDER BY answered_ms DESC LIMIT -1 OFFSET ?))",
                (before_ms, keep),
            )
            return cursor.rowcount

    def counts(self) -> dict[str, int]:
        """``{"pending": n, "answered": m}``."""
        with self._lock:
            pending, answered = self._db.execute(
                "SELECT COUNT(*) - COUNT(answered_ms), COUNT(answered_ms) FROM requests"
            ).fetchone()
        return {"pending": int(pending), "answered": int(answered)}

    def close(self) -> None:
        """Close the file (a later call of any method raises ``sqlite3.ProgrammingError``)."""
        with self._lock, self._read_lock:
            self._reads.close()
            self._marks.close()
            self._db.close()
