"""A rollout's progress on the operator's side, so a killed operator resumes where it stopped.

``STATE_DIR/rollouts.sqlite`` (WAL, ``synchronous=FULL``: a step recorded is on disk)::

    rollout(name, release_id, package, plan, state, started_ms, ended_ms)
    device(name, device_id, wave, position, state, reason, attempts, sent_ms, ended_ms, digest)

A device's row says ``sending`` *before* its deploy's first message goes out, so a resumed
rollout knows which devices may have seen it and asks them (their retained ``ota/status``)
before sending anything again. ``STATE_DIR/NAME.lock`` is held with ``flock`` while a rollout
of NAME runs: a second one is refused, and the kernel releases the lock when the holder dies
however it dies (no stale lock file to clear by hand).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError

__all__ = ["DeviceRow", "Progress", "RolloutBusyError", "rollout_lock"]

DB_NAME = "rollouts.sqlite"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollout (
    name TEXT PRIMARY KEY, release_id TEXT NOT NULL, package TEXT NOT NULL, plan TEXT NOT NULL,
    state TEXT NOT NULL, started_ms INTEGER NOT NULL, ended_ms INTEGER);
CREATE TABLE IF NOT EXISTS device (
    name TEXT NOT NULL, device_id TEXT NOT NULL, wave INTEGER NOT NULL, position INTEGER NOT NULL,
    state TEXT NOT NULL, reason TEXT, attempts INTEGER NOT NULL DEFAULT 0, sent_ms INTEGER,
    ended_ms INTEGER, digest TEXT, PRIMARY KEY (name, device_id));
"""
# Device states that end its part of a rollout.
DONE = frozenset({"committed", "active", "rolled_back", "failed", "refused", "timeout",
                  "offline", "skipped"})  # fmt: skip


class RolloutBusyError(ConfigError):
    """Another rollout of the same name runs now (its process holds the lock)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


@contextmanager
def rollout_lock(state_dir: Path, name: str) -> Iterator[None]:
    """Hold ``STATE_DIR/NAME.lock`` (``RolloutBusyError`` when another process holds it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = path.read_text().strip() or "another process"
            raise RolloutBusyError(
                f"a rollout of {name!r} is running ({holder}); wait for it, or stop it and "
                "run this again to resume it"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock (a killed process's is released by the kernel)


@dataclass(frozen=True)
class DeviceRow:
    """One device of a rollout, as recorded."""

    device_id: str
    wave: int
    position: int
    state: str
    reason: str | None
    attempts: int
    sent_ms: int | None
    ended_ms: int | None
    digest: str | None

    @property
    def done(self) -> bool:
        """Whether its part of the rollout ended."""
        return self.state in DONE


class Progress:
    """The rollouts recorded in ``state_dir`` (one connection, shared by a wave's threads)."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            state_dir / DB_NAME, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def rollout(self, name: str) -> dict[str, Any] | None:
        """The recorded rollout of ``name``, or ``None``."""
        with self._lock:
            row = self._db.execute(
                "SELECT release_id, package, plan, state, started_ms, ended_ms FROM rollout "
                "WHERE name = ?",
                (name,),
            ).fetchone()
        if row is None:
            return None
        keys = ("release_id", "package", "plan", "state", "started_ms", "ended_ms")
        found = dict(zip(keys, row, strict=True))
        found["plan"] = json.loads(found["plan"])
        return found

    def begin(
        self,
        name: str,
        *,
        release_id: str,
        package: str,
        plan: dict[str, Any],
        waves: Sequence[Sequence[str]],
    ) -> None:
        """Record a new rollout of ``name`` and its devices in ``waves`` (replacing a finished
        one of the same name)."""
        with self._transaction():
            self._db.execute("DELETE FROM rollout WHERE name = ?", (name,))
            self._db.execute("DELETE FROM device WHERE name = ?", (name,))
            self._db.execute(
                "INSERT INTO rollout VALUES (?, ?, ?, ?, 'running', ?, NULL)",
                (name, release_id, package, json.dumps(plan), _now_ms()),
            )
            position = 0
            for wave, devices in enumerate(waves):
                for device in devices:
                    self._db.execute(
                        "INSERT INTO device (name, device_id, wave, position, state) "
                        "VALUES (?, ?, ?, ?, 'pending')",
                        (name, device, wave, position),
                    )
                    position += 1

    def devices(self, name: str) -> list[DeviceRow]:
        """The devices of ``name``'s rollout, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT device_id, wave, position, state, reason, attempts, sent_ms, "
                "ended_ms, digest FROM device WHERE name = ? ORDER BY position",
                (name,),
            ).fetchall()
        return [DeviceRow(*row) for row in rows]

    def sending(self, name: str, device_id: str) -> None:
        """Record that ``device_id``'s deploy starts now (before its first message)."""
        with self._transaction():
            self._db.execute(
                "UPDATE device SET state = 'sending', attempts = attempts + 1, "
                "sent_ms = COALESCE(sent_ms, ?) WHERE name = ? AND device_id = ?",
                (_now_ms(), name, device_id),
            )

    def mark(
        self, name: str, device_id: str, state: str, *, reason: str | None = None,
        digest: str | None = None,
    ) -> None:  # fmt: skip
        """Record ``device_id``'s state (its end time once it is done)."""
        ended = _now_ms() if state in DONE else None
        with self._transaction():
            self._db.execute(
                "UPDATE device SET state = ?, reason = ?, ended_ms = COALESCE(?, ended_ms), "
                "digest = COALESCE(?, digest) WHERE name = ? AND device_id = ?",
                (state, reason, ended, digest, name, device_id),
            )

    def finish(self, name: str, state: str) -> None:
        """Record how the rollout ended: ``done`` or ``aborted``."""
        with self._transaction():
            self._db.execute(
                "UPDATE rollout SET state = ?, ended_ms = ? WHERE name = ?",
                (state, _now_ms(), name),
            )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
