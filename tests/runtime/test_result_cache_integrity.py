"""A result served from the SQLite cache is this package's result for this input: a row written
by anyone without the cache folder's device key is a miss, and is deleted."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer import CacheConfig
from edgeinfer.runtime.cache.integrity import KEY_NAME
from edgeinfer.runtime.cache.results import ResultCache
from edgeinfer.runtime.tasks import EmbeddingCodec

TEXT = "pump valve pressure rising"


@pytest.fixture(scope="module")
def other_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package of the same shape as ``fast_encoder`` with other weights."""
    from fast_packages import tiny_encoder

    return tiny_encoder(tmp_path_factory.mktemp("other") / "tiny-encoder", seed=1)


def _rows(db: Path) -> list[tuple[bytes, bytes]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT key, value FROM entries"))


def _db(package: Path, folder: Path) -> Path:
    return CacheConfig(directory=folder).db_path(edgeinfer.Manifest.read(package).digest)


def test_another_packages_answer_written_under_this_inputs_key_is_never_served(
    fast_encoder: Path,
    other_encoder: Path,
    tmp_path: Path,
    graph_runs: Counter[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = CacheConfig(directory=tmp_path)
    own = edgeinfer.load(fast_encoder, cache=config).embed([TEXT])
    others = edgeinfer.load(other_encoder, cache=config).embed([TEXT])
    assert not np.allclose(own, others)
    [(key, _)] = _rows(_db(fast_encoder, tmp_path))
    [(_, forged)] = _rows(_db(other_encoder, tmp_path))  # tagged in this folder, for its key
    with sqlite3.connect(_db(fast_encoder, tmp_path)) as conn:
        conn.execute("UPDATE entries SET value = ? WHERE key = ?", (forged, key))
    model = edgeinfer.load(fast_encoder, cache=config)  # a fresh memory tier: disk is asked
    graph_runs.clear()
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.cache.results"):
        [answer] = model.embed_with_info([TEXT])
    np.testing.assert_array_equal(answer.vector, own[0])  # the old code served the other's
    assert not answer.cached and graph_runs[fast_encoder.name] == 1
    assert "not written with this device's key was deleted" in caplog.text
    [(_, stored)] = _rows(_db(fast_encoder, tmp_path))
    assert stored != forged  # the forged row went; the fresh answer took its place
    again = edgeinfer.load(fast_encoder, cache=config).embed_with_info([TEXT])
    assert again[0].cached and np.array_equal(again[0].vector, own[0])


def _cache(folder: Path) -> ResultCache[np.ndarray]:
    return ResultCache(
        digest="d" * 64,
        task="embed",
        params={},
        codec=EmbeddingCodec(),
        config=CacheConfig(directory=folder),
    )


def test_a_row_written_without_the_key_is_a_miss_and_is_deleted(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    key = cache.key(np.array([2, 5, 3]))
    forged = np.ones(4, dtype=np.float32)
    untagged = EmbeddingCodec().encode(forged)
    for value in (untagged, bytes(32) + untagged):  # no tag; a made-up one
        with sqlite3.connect(_db_path(tmp_path)) as conn:
            row = (key, value, len(value), time.time())
            conn.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)", row)
        assert _cache(tmp_path).get(key) is None
        assert _rows(_db_path(tmp_path)) == []
    cache.put_many([(key, np.zeros(4, dtype=np.float32))])
    found = _cache(tmp_path).get(key)
    assert found is not None and found[1] == "disk" and not found[0].any()


def test_a_row_from_another_folders_key_is_a_miss(tmp_path: Path) -> None:
    """A cache file copied from another device (or folder): its rows carry another key's
    tags."""
    elsewhere = _cache(tmp_path / "elsewhere")
    key = elsewhere.key(np.array([2, 5, 3]))
    elsewhere.put_many([(key, np.ones(4, dtype=np.float32))])
    elsewhere.close()
    (tmp_path / "here").mkdir()
    _db_path(tmp_path / "elsewhere").rename(_db_path(tmp_path / "here"))
    assert _cache(tmp_path / "here").get(key) is None


def test_a_key_others_may_read_leaves_the_cache_in_memory_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _cache(tmp_path).close()
    (tmp_path / KEY_NAME).chmod(0o640)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.cache.results"):
        cache = _cache(tmp_path)
    assert cache.disk is None and "others may read it" in caplog.text
    key = cache.key(np.array([2, 5, 3]))
    cache.put_many([(key, np.ones(4, dtype=np.float32))])
    found = cache.get(key)
    assert found is not None and found[1] == "memory"


def _db_path(folder: Path) -> Path:
    return CacheConfig(directory=folder).db_path("d" * 64)
