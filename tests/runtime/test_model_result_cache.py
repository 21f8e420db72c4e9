"""The result cache wired into ``Model`` on real packages: cached == fresh, a hit runs no
session, answers survive a restart, a corrupt file never fails inference."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer import CacheConfig
from edgeinfer.errors import ConfigError

TEXTS = [
    "The central bank left interest rates unchanged.",
    "A short one.",
    "The striker scored twice in the second half to win the cup final for his club.",
]


def test_embed_hit_equals_fresh_and_runs_no_session(
    minilm_int8: Path, tmp_path: Path, graph_runs: Counter[str]
) -> None:
    fresh = edgeinfer.load(minilm_int8).embed(TEXTS, batch_size=1)
    model = edgeinfer.load(minilm_int8, cache=CacheConfig(directory=tmp_path))
    graph_runs.clear()  # the loads' warm-up runs
    runs = graph_runs
    first = model.embed_with_info(TEXTS, batch_size=1)
    assert runs[minilm_int8.name] == 3 and not any(r.cached for r in first)
    np.testing.assert_array_equal(np.stack([r.vector for r in first]), fresh)
    again = model.embed_with_info(TEXTS)
    assert runs[minilm_int8.name] == 3  # every text answered from the cache
    assert all(r.cached and r.compute_ms == 0.0 for r in again)
    np.testing.assert_array_equal(np.stack([r.vector for r in again]), fresh)
    np.testing.assert_array_equal(model.embed(TEXTS), fresh)
    mixed = model.embed_with_info([TEXTS[1], "A text never seen before."])
    assert [r.cached for r in mixed] == [True, False] and runs[minilm_int8.name] == 4
    assert model.metrics().cache_hits["embed"]["memory"] == 7


def test_classify_hit_equals_fresh_and_runs_no_session(
    minilm_classifier: Path, tmp_path: Path, graph_runs: Counter[str]
) -> None:
    fresh = edgeinfer.load(minilm_classifier).classify(TEXTS, batch_size=1)
    model = edgeinfer.load(minilm_classifier, cache=CacheConfig(directory=tmp_path))
    graph_runs.clear()  # the loads' warm-up runs
    model.classify(TEXTS, batch_size=1)
    cached = model.classify(TEXTS)
    assert graph_runs[minilm_classifier.name] == 3 and all(r.cached for r in cached)
    for hit, ref in zip(cached, fresh, strict=True):
        assert (hit.label, hit.score, hit.scores) == (ref.label, ref.score, ref.scores)
    reloaded = edgeinfer.load(minilm_classifier, cache=CacheConfig(directory=tmp_path))
    from_disk = reloaded.classify(TEXTS)
    assert all(r.cached for r in from_disk)
    assert [r.scores for r in from_disk] == [r.scores for r in fresh]
    assert reloaded.metrics().cache_hits["classify"] == {"disk": 3}


_RESTART = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import edgeinfer
    from edgeinfer.runtime.session import GraphSession
    model = edgeinfer.load(sys.argv[1], cache=edgeinfer.CacheConfig(directory=Path(sys.argv[2])))
    runs = [0]
    run = GraphSession.run
    def counted(self, feeds):
        runs[0] += 1
        return run(self, feeds)
    GraphSession.run = counted
    results = model.embed_with_info(json.loads(sys.argv[3]))
    print(json.dumps({"runs": runs[0], "cached": [r.cached for r in results],
                      "vectors": [r.vector.tolist() for r in results]}))
    """
)


def test_a_new_process_answers_from_sqlite(minilm_int8: Path, tmp_path: Path) -> None:
    first = edgeinfer.load(minilm_int8, cache=CacheConfig(directory=tmp_path))
    expected = first.embed(TEXTS)
    first.close()
    out = subprocess.run(
        [sys.executable, "-c", _RESTART, str(minilm_int8), str(tmp_path), json.dumps(TEXTS)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    reply = json.loads(out.stdout)
    assert reply["runs"] == 0 and reply["cached"] == [True, True, True]
    np.testing.assert_array_equal(np.array(reply["vectors"], dtype=np.float32), expected)


def test_corrupt_cache_file_never_fails_inference(minilm_int8: Path, tmp_path: Path) -> None:
    config = CacheConfig(directory=tmp_path)
    db = config.db_path(edgeinfer.Manifest.read(minilm_int8).digest)
    db.write_bytes(b"\x00garbage" * 1000)
    model = edgeinfer.load(minilm_int8, cache=config)
    assert model.embed(TEXTS).shape == (3, 384)
    assert all(r.cached for r in model.embed_with_info(TEXTS))
    assert list(tmp_path.glob(db.name + ".corrupt-*"))


def test_memory_only_cache_writes_no_file(minilm_int8: Path, tmp_path: Path) -> None:
    model = edgeinfer.load(minilm_int8, cache=CacheConfig(persist=False, directory=tmp_path))
    model.embed(TEXTS)
    assert all(r.cached for r in model.embed_with_info(TEXTS))
    assert not list(tmp_path.iterdir())
    model.clear_cache()
    assert not any(r.cached for r in model.embed_with_info(TEXTS))


def test_truncated_texts_share_a_key_only_when_their_tokens_match(
    minilm_int8: Path, tmp_path: Path
) -> None:
    model = edgeinfer.load(minilm_int8, cache=CacheConfig(persist=False))
    long_a, long_b = "word " * 600 + "alpha", "word " * 600 + "beta"
    model.embed(long_a)
    # Both truncate to the same 256 tokens, so the model's answer is the same: a correct hit.
    assert model.embed_with_info(long_b)[0].cached
    assert not model.embed_with_info("word alpha")[0].cached


def test_cache_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        CacheConfig(memory_bytes=-1)
    with pytest.raises(ConfigError):
        CacheConfig(disk_bytes=0)
    with pytest.raises(ConfigError):
        CacheConfig(ttl_s=0)
    with pytest.raises(ConfigError):
        edgeinfer.SemanticCacheConfig(embedder=Path("x"), threshold=1.5)
    with pytest.raises(ConfigError):
        edgeinfer.BatchConfig(max_batch_size=0)
    with pytest.raises(ConfigError):
        edgeinfer.BatchConfig(max_wait_ms=-1)
