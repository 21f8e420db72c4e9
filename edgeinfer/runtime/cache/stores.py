"""The two tiers of the exact result cache, behind one protocol (``ResultStore``).

``MemoryStore`` keeps decoded values in an LRU bounded in bytes (a hit is a dict lookup, no
decoding). ``SqliteStore`` keeps encoded bytes in a SQLite file in WAL mode with a busy timeout,
so several processes on one device may read and write one file; writes are single transactions
that keep a running byte total (maintained by triggers) and evict the oldest entries past the
capacity. Recency is the memory tier's job: the disk tier evicts by store time (a hit would
otherwise be a write). The disk tier never raises: every SQLite or OS error is logged and read
as a miss; a file that SQLite reports corrupt (or not a database) is moved aside as
``<file>.corrupt-<time>`` and a fresh one is created.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

__all__ = ["ENTRY_OVERHEAD_BYTES", "MemoryStore", "ResultStore", "SqliteStore", "StoreStats"]

log = logging.getLogger(__name__)

V = TypeVar("V")
# Bytes charged per memory entry beyond key and value: the OrderedDict node, tuple and object
# headers (measured ~150-250 bytes with sys.getsizeof on CPython 3.11).
ENTRY_OVERHEAD_BYTES = 200
# SQLite extended result codes whose low byte means the file itself is unusable.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
# Wait this long for another process' write lock before giving up (then: a logged miss).
_BUSY_TIMEOUT_MS = 5000
# Map up to this much of the file for reads (address space only; pages load on demand).
_MMAP_BYTES = 256 * 2**20
_SELECT = "SELECT value, stored_s FROM entries WHERE key = ?"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, size_bytes INTEGER NOT NULL,
    stored_s REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_by_age ON entries (stored_s);
CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (0, 0);
CREATE TRIGGER IF NOT EXISTS entries_insert AFTER INSERT ON entries
    BEGIN UPDATE totals SET bytes = bytes + NEW.size_bytes WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS entries_delete AFTER DELETE ON entries
    BEGIN UPDATE totals SET bytes = bytes - OLD.size_bytes WHERE id = 0; END;
CREATE TRIGGER IF NOT EXISTS entries_update AFTER UPDATE OF size_bytes ON entries
    BEGIN UPDATE totals SET bytes = bytes - OLD.size_bytes + NEW.size_bytes WHERE id = 0; END;
"""


@dataclass(frozen=True)
class StoreStats:
    """How full a store is. ``path`` and ``file_bytes`` only for the SQLite tier."""

    entries: int
    bytes: int
    capacity_bytes: int
    path: str | None = None
    file_bytes: int | None = None
    oldest_s: float | None = None
    newest_s: float | None = None


class ResultStore(Protocol[V]):
    """What both tiers do: get by key, put a batch, clear, report their size."""

    def get(self, key: bytes) -> tuple[V, float] | None:
        """The value and its store time (unix seconds), or ``None`` (absent or expired)."""

    def put_many(self, items: Sequence[tuple[bytes, V, int]], *, stored_s: float) -> None:
        """Store ``(key, value, size_bytes)`` items, evicting to stay within capacity."""

    def clear(self) -> None:
        """Remove every entry."""

    def stats(self) -> StoreStats:
        """Entries, bytes and capacity."""


class MemoryStore(Generic[V]):
    """A thread-safe LRU bounded in bytes, with a TTL.

    Args:
        capacity_bytes: the bound; the least recently used entries go first.
        ttl_s: seconds an entry stays valid after it was first stored (``None``: forever).
    """

    def __init__(self, *, capacity_bytes: int, ttl_s: float | None) -> None:
        self.capacity_bytes = capacity_bytes
        self._ttl_s = math.inf if ttl_s is None else ttl_s
        self._lock = threading.Lock()
        # key -> (value, size_bytes, stored_s)
        self._entries: OrderedDict[bytes, tuple[V, int, float]] = OrderedDict()
        self._bytes = 0

    def get(self, key: bytes) -> tuple[V, float] | None:
        """The value and its store time, or ``None``; a hit becomes the most recent entry."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if time.time() - entry[2] > self._ttl_s:
                del self._entries[key]
                self._bytes -= entry[1]
                return None
            self._entries.move_to_end(key)
            return entry[0], entry[2]

    def put_many(self, items: Sequence[tuple[bytes, V, int]], *, stored_s: float) -> None:
        """Store items (an item larger than the whole capacity is skipped)."""
        with self._lock:
            for key, value, size in items:
                size += len(key) + ENTRY_OVERHEAD_BYTES
                if size > self.capacity_bytes:
                    continue
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old[1]
                while self._bytes + size > self.capacity_bytes:
                    _, (_, evicted, _) = self._entries.popitem(last=False)
                    self._bytes -= evicted
                self._entries[key] = (value, size, stored_s)
                self._bytes += size

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> StoreStats:
        """Entries and bytes in use."""
        with self._lock:
            return StoreStats(len(self._entries), self._bytes, self.capacity_bytes)


class SqliteStore:
    """Encoded values in a SQLite file (WAL), bounded in bytes, with a TTL; never raises.

    Args:
        path: the database file (its folder is created).
        capacity_bytes: the bound on stored keys and values; the oldest entries go first.
        ttl_s: seconds an entry stays valid after it was stored (``None``: forever).
    """

    def __init__(self, path: Path, *, capacity_bytes: int, ttl_s: float | None) -> None:
        self.path = path
        self.capacity_bytes = capacity_bytes
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        with self._lock:
            self._conn = self._open_or_rebuild()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=_BUSY_TIMEOUT_MS / 1e3,
            isolation_level=None,
            check_same_thread=False,  # guarded by self._lock
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            # A cache may lose its last writes on power loss; it must not pay an fsync per put.
            conn.execute("PRAGMA synchronous = NORMAL")
            # Reads through a memory map skip a read() system call per page.
            conn.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
            conn.executescript(_SCHEMA)
            conn.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_or_rebuild(self) -> sqlite3.Connection | None:
        try:
            return self._connect()
        except sqlite3.Error as exc:
            if not _is_corrupt(exc):
                log.warning("result cache %s unavailable (%s); running without it", self.path, exc)
                return None
            self._move_aside(exc)
        except OSError as exc:
            log.warning("result cache %s unavailable (%s); running without it", self.path, exc)
            return None
        try:
            return self._connect()
        except (sqlite3.Error, OSError) as exc:
            log.warning(
                "result cache %s cannot be rebuilt (%s); running without it", self.path, exc
            )
            return None

    def _move_aside(self, exc: BaseException) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.time():.0f}")
        log.error(
            "result cache %s is corrupt (%s); moved to %s, starting empty", self.path, exc, aside
        )
        try:
            self.path.replace(aside)
        except OSError as move_exc:  # another process moved it first, or a read-only folder
            log.warning("could not move %s aside: %s", self.path, move_exc)
        for suffix in ("-wal", "-shm"):
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)

    @contextmanager
    def _guard(self, action: str) -> Iterator[sqlite3.Connection | None]:
        """Yield the connection (``None``: no cache); log every error, rebuild if corrupt."""
        with self._lock:
            try:
                yield self._conn
            except (sqlite3.Error, OSError) as exc:
                self._failed(action, exc)

    def _failed(self, action: str, exc: sqlite3.Error | OSError) -> None:
        """Under the lock: log a failed operation; move a corrupt file aside and rebuild."""
        log.warning("result cache %s: %s failed: %s", self.path, action, exc)
        if isinstance(exc, sqlite3.Error) and _is_corrupt(exc):
            if self._conn is not None:
                self._conn.close()
            self._move_aside(exc)
            self._conn = self._open_or_rebuild()

    def get(self, key: bytes) -> tuple[bytes, float] | None:
        """The encoded value and its store time, or ``None`` (absent, expired, or an error)."""
        # The hot read path: inline rather than through _guard (a generator per call).
        with self._lock:
            if self._conn is None:
                return None
            try:
                row = self._conn.execute(_SELECT, (key,)).fetchone()
            except (sqlite3.Error, OSError) as exc:
                self._failed("read", exc)
                return None
        if row is None or (self._ttl_s is not None and time.time() - row[1] > self._ttl_s):
            return None
        return row[0], row[1]

    def put_many(self, items: Sequence[tuple[bytes, bytes, int]], *, stored_s: float) -> None:
        """Store items in one transaction, drop expired entries, evict the oldest past capacity."""
        rows = [
            (k, v, len(k) + len(v), stored_s)
            for k, v, _ in items
            if len(k) + len(v) <= self.capacity_bytes
        ]
        if not rows:
            return
        with self._guard("write") as conn:
            if conn is None:
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT INTO entries VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
                    "value = excluded.value, size_bytes = excluded.size_bytes, "
                    "stored_s = excluded.stored_s",
                    rows,
                )
                if self._ttl_s is not None:
                    conn.execute(
                        "DELETE FROM entries WHERE stored_s < ?", (time.time() - self._ttl_s,)
                    )
                self._evict(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def _evict(self, conn: sqlite3.Connection) -> None:
        excess = int(conn.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0])
        excess -= self.capacity_bytes
        if excess <= 0:
            return
        doomed: list[tuple[bytes]] = []
        for key, size in conn.execute("SELECT key, size_bytes FROM entries ORDER BY stored_s, key"):
            doomed.append((key,))
            excess -= size
            if excess <= 0:
                break
        conn.executemany("DELETE FROM entries WHERE key = ?", doomed)

    def delete(self, key: bytes) -> None:
        """Remove the entry of ``key``, if there is one."""
        with self._guard("delete") as conn:
            if conn is not None:
                conn.execute("DELETE FROM entries WHERE key = ?", (key,))

    def clear(self) -> None:
        """Delete every entry and give the space back to the file system."""
        with self._guard("clear") as conn:
            if conn is None:
                return
            conn.execute("DELETE FROM entries")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")

    def stats(self) -> StoreStats:
        """Entries, bytes, the file's size on disk, the oldest and newest store times."""
        with self._guard("stats") as conn:
            if conn is not None:
                count, oldest, newest = conn.execute(
                    "SELECT count(*), min(stored_s), max(stored_s) FROM entries"
                ).fetchone()
                total = conn.execute("SELECT bytes FROM totals WHERE id = 0").fetchone()[0]
                files = [self.path, self.path.with_name(self.path.name + "-wal")]
                file_bytes = sum(p.stat().st_size for p in files if p.exists())
                return StoreStats(
                    int(count),
                    int(total),
                    self.capacity_bytes,
                    str(self.path),
                    file_bytes,
                    oldest,
                    newest,
                )
        return StoreStats(0, 0, self.capacity_bytes, str(self.path))

    def close(self) -> None:
        """Close the connection (later calls are misses)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _is_corrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc).lower()  # Python < 3.11 has no error codes on exceptions
    return "malformed" in text or "not a database" in text
