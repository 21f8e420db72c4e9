"""The exact cache's stores on real SQLite: keys, LRU by bytes, TTL, eviction, corruption,
two processes writing one file."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config import CacheConfig
from edgeinfer.runtime.cache.results import ResultCache
from edgeinfer.runtime.cache.stores import ENTRY_OVERHEAD_BYTES, MemoryStore, SqliteStore
from edgeinfer.runtime.tasks import ClassificationCodec, ClassificationResult, EmbeddingCodec


def _cache(
    tmp_path: Path,
    *,
    digest: str = "d" * 64,
    task: str = "embed",
    params: dict[str, object] | None = None,
) -> ResultCache[np.ndarray]:
    return ResultCache(
        digest=digest,
        task=task,
        params=params or {"normalize": True},
        codec=EmbeddingCodec(),
        config=CacheConfig(directory=tmp_path),
    )


def test_key_covers_package_task_parameters_and_input(tmp_path: Path) -> None:
    ids = np.array([101, 2023, 102], dtype=np.int64)
    base = _cache(tmp_path)
    keys = {
        base.key(ids),
        _cache(tmp_path, digest="e" * 64).key(ids),
        _cache(tmp_path, task="classify").key(ids),
        _cache(tmp_path, params={"normalize": False}).key(ids),
        base.key(ids[:2]),
        base.tensor_key(ids),
        base.tensor_key(ids.astype(np.int32)),
        base.tensor_key(ids.reshape(1, 3)),
    }
    assert len(keys) == 8
    assert base.key(ids) == _cache(tmp_path).key(ids.copy())  # stable across instances
    # Token ids are the same text whatever integer type the graph takes, and byte order.
    assert base.key(ids) == base.key(ids.astype(np.int32)) == base.key(ids.astype(">i8"))
    assert base.tensor_key(ids) == base.tensor_key(ids.astype(">i8"))


def test_codecs_round_trip_exactly() -> None:
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    decoded = EmbeddingCodec().decode(EmbeddingCodec().encode(vector))
    np.testing.assert_array_equal(decoded, vector)
    assert not decoded.flags.writeable
    result = ClassificationResult(label="b", score=0.7, scores={"b": 0.7, "a": 0.3 + 1e-9})
    again = ClassificationCodec().decode(ClassificationCodec().encode(result))
    assert again == result and list(again.scores) == ["b", "a"]


def test_memory_lru_is_bounded_in_bytes_and_evicts_least_recent() -> None:
    value_bytes = 1000
    entry = value_bytes + 32 + ENTRY_OVERHEAD_BYTES
    store: MemoryStore[str] = MemoryStore(capacity_bytes=3 * entry, ttl_s=None)
    now = time.time()
    for name in "abc":
        store.put_many([(name.encode() * 32, name, value_bytes)], stored_s=now)
    assert store.get(b"a" * 32) is not None  # a becomes the most recent
    store.put_many([(b"d" * 32, "d", value_bytes)], stored_s=now)
    assert store.get(b"b" * 32) is None  # b was the least recent
    assert [store.get(k * 32) is not None for k in (b"a", b"c", b"d")] == [True] * 3
    stats = store.stats()
    assert stats.entries == 3 and stats.bytes == 3 * entry <= stats.capacity_bytes
    store.put_many([(b"e" * 32, "too big", 10 * entry)], stored_s=now)
    assert store.get(b"e" * 32) is None and store.stats().entries == 3


def test_entries_expire_after_ttl_in_both_tiers(tmp_path: Path) -> None:
    memory: MemoryStore[str] = MemoryStore(capacity_bytes=2**20, ttl_s=60)
    disk = SqliteStore(tmp_path / "c.sqlite3", capacity_bytes=2**20, ttl_s=60)
    old, fresh = time.time() - 61, time.time()
    memory.put_many([(b"old", "x", 1)], stored_s=old)
    memory.put_many([(b"new", "y", 1)], stored_s=fresh)
    disk.put_many([(b"old", b"x", 1)], stored_s=old)
    assert disk.get(b"old") is None  # expired: a miss even before it is purged
    disk.put_many([(b"new", b"y", 1)], stored_s=fresh)
    assert memory.get(b"old") is None and memory.get(b"new") == ("y", fresh)
    assert disk.get(b"new") == (b"y", fresh)
    assert disk.stats().entries == 1  # the write purged the expired row


def test_sqlite_is_bounded_in_bytes_and_evicts_oldest(tmp_path: Path) -> None:
    entry = 32 + 1000
    disk = SqliteStore(tmp_path / "c.sqlite3", capacity_bytes=5 * entry, ttl_s=None)
    start = time.time()
    for i in range(12):
        disk.put_many([(bytes([i]) * 32, bytes([i]) * 1000, 0)], stored_s=start + i)
        stats = disk.stats()
        assert stats.bytes <= stats.capacity_bytes
    present = [i for i in range(12) if disk.get(bytes([i]) * 32) is not None]
    assert present == [7, 8, 9, 10, 11]
    assert disk.stats().bytes == 5 * entry  # the trigger-kept total matches the rows
    disk.put_many([(b"k" * 32, b"v" * 10 * entry, 0)], stored_s=start)  # larger than capacity
    assert disk.get(b"k" * 32) is None and disk.stats().entries == 5


def test_overwriting_a_key_keeps_the_byte_total_right(tmp_path: Path) -> None:
    disk = SqliteStore(tmp_path / "c.sqlite3", capacity_bytes=2**20, ttl_s=None)
    disk.put_many([(b"k", b"short", 0)], stored_s=time.time())
    disk.put_many([(b"k", b"a longer value", 0)], stored_s=time.time())
    stats = disk.stats()
    assert stats.entries == 1 and stats.bytes == len(b"k") + len(b"a longer value")


def test_corrupt_file_is_moved_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"this is not a database, just bytes " * 200)
    with caplog.at_level(logging.ERROR):
        disk = SqliteStore(path, capacity_bytes=2**20, ttl_s=None)
    assert "corrupt" in caplog.text
    aside = list(tmp_path.glob("c.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    disk.put_many([(b"k", b"v", 0)], stored_s=time.time())
    assert disk.get(b"k") is not None


def test_damaged_pages_are_recovered_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    disk = SqliteStore(path, capacity_bytes=2**24, ttl_s=None)
    rng = np.random.default_rng(0)
    disk.put_many(
        [(bytes(rng.bytes(32)), rng.bytes(3000), 0) for _ in range(200)], stored_s=time.time()
    )
    disk.close()  # checkpoints the WAL into the file
    data = bytearray(path.read_bytes())
    data[4096 : len(data) - 4096] = b"\x13" * (len(data) - 8192)  # keep header, smash the pages
    path.write_bytes(bytes(data))
    reopened = SqliteStore(path, capacity_bytes=2**24, ttl_s=None)
    for _ in range(3):  # whichever operation meets the damage, none raises
        assert reopened.get(b"x" * 32) is None
        reopened.put_many([(b"k" * 32, b"v", 0)], stored_s=time.time())
        reopened.stats()
    assert reopened.get(b"k" * 32) is not None
    assert list(tmp_path.glob("c.sqlite3.corrupt-*"))


def test_unusable_location_degrades_to_no_disk_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    disk = SqliteStore(blocker / "c.sqlite3", capacity_bytes=2**20, ttl_s=None)
    disk.put_many([(b"k", b"v", 0)], stored_s=time.time())
    assert disk.get(b"k") is None
    assert disk.stats().entries == 0


_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from edgeinfer.runtime.cache.stores import SqliteStore
    path, tag, count = Path(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3])
    store = SqliteStore(path, capacity_bytes=2**30, ttl_s=None)
    print("ready", flush=True)
    sys.stdin.readline()  # the test's "go", sent once both writers are connected
    for i in range(count):
        store.put_many([(tag + i.to_bytes(4, "big"), tag * 100, 0)], stored_s=time.time())
    """
)


def test_two_processes_writing_one_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    SqliteStore(path, capacity_bytes=2**30, ttl_s=None).close()
    count = 300
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), tag, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("A", "B")
    ]
    for writer in writers:  # both connected and waiting
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
    for writer in writers:  # then both write at once
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        assert "failed" not in err  # no write was dropped on a lock timeout
    disk = SqliteStore(path, capacity_bytes=2**30, ttl_s=None)
    for tag in (b"A", b"B"):
        for i in range(count):
            assert disk.get(tag + i.to_bytes(4, "big")) is not None
    stats = disk.stats()
    assert stats.entries == 2 * count and stats.bytes == 2 * count * (5 + 100)
