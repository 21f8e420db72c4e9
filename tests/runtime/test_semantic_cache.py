"""The semantic cache: nearest-neighbour answers at τ, the false-hit calibration, and the
cache wired into a real classification package with a real MiniLM int8 embedder."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer import CacheConfig, SemanticCacheConfig
from edgeinfer.errors import ConfigError
from edgeinfer.runtime.cache.semantic import SemanticCache, calibrate_threshold, threshold_curve


def _unit(*rows: Sequence[float]) -> np.ndarray:
    x = np.array(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _no_embedder(texts: Sequence[str]) -> np.ndarray:
    raise AssertionError("these tests pass vectors directly")


def test_lookup_answers_only_at_or_above_threshold() -> None:
    cache: SemanticCache[str] = SemanticCache(embed=_no_embedder, threshold=0.9, max_entries=8)
    assert cache.lookup(_unit([1, 0])) == [None]
    cache.add(_unit([1, 0], [0, 1]), ["east", "north"])
    near = cache.lookup(_unit([1, 0.1], [1, 1], [0, 1]))
    assert near[0] is not None and near[0][0] == "east" and near[0][1] >= 0.9
    assert near[1] is None  # cosine 0.707 to both
    assert near[2] is not None and near[2] == ("north", pytest.approx(1.0))


def test_capacity_replaces_the_oldest_entry() -> None:
    cache: SemanticCache[int] = SemanticCache(embed=_no_embedder, threshold=0.99, max_entries=2)
    cache.add(_unit([1, 0, 0], [0, 1, 0], [0, 0, 1]), [1, 2, 3])
    assert len(cache) == 2
    assert cache.lookup(_unit([1, 0, 0])) == [None]
    assert [hit[0] if hit else None for hit in cache.lookup(_unit([0, 1, 0], [0, 0, 1]))] == [2, 3]
    cache.clear()
    assert len(cache) == 0 and cache.lookup(_unit([0, 1, 0])) == [None]


def test_calibration_meets_the_budget_with_the_most_hits() -> None:
    rng = np.random.default_rng(0)
    # Wrong neighbours are less similar (around 0.75) than right ones (around 0.9).
    right = np.clip(rng.normal(0.90, 0.04, 3000), -1, 1)
    wrong = np.clip(rng.normal(0.75, 0.05, 600), -1, 1)
    similarity = np.concatenate([right, wrong])
    same = np.concatenate([np.ones(3000, bool), np.zeros(600, bool)])
    calibration = calibrate_threshold(similarity, same, false_hit_budget=0.01)
    chosen = calibration.chosen
    assert chosen.false_hit_upper <= 0.01 and chosen.false_hit_rate <= 0.01
    lower = [p for p in calibration.curve if p.threshold < calibration.threshold]
    assert lower and all(p.false_hit_upper > 0.01 for p in lower)  # τ is the lowest that passes
    rates = [p.hit_rate for p in calibration.curve]
    assert rates == sorted(rates, reverse=True)  # a higher τ never hits more


def test_calibration_refuses_data_where_no_threshold_works() -> None:
    similarity = np.full(100, 0.95)
    with pytest.raises(ConfigError, match="no threshold"):
        calibrate_threshold(similarity, np.zeros(100, bool))
    with pytest.raises(ConfigError):
        threshold_curve(similarity, np.zeros(99, bool), [0.5])


def test_semantic_hit_on_a_real_classifier_runs_no_classifier_session(
    minilm_classifier: Path, minilm_int8: Path, graph_runs: Counter[str]
) -> None:
    semantic = SemanticCacheConfig(embedder=minilm_int8, threshold=0.8)
    model = edgeinfer.load(minilm_classifier, cache=CacheConfig(persist=False, semantic=semantic))
    graph_runs.clear()  # the loads' warm-up runs
    original = model.classify("Stock markets fell sharply on Monday.")[0]
    paraphrase, unrelated = model.classify(
        ["Stock markets dropped steeply on Monday.", "The goalkeeper saved a late penalty."]
    )
    assert paraphrase.cached and not unrelated.cached
    assert graph_runs[minilm_classifier.name] == 2  # the embedder ran for all three
    assert (paraphrase.label, paraphrase.scores) == (original.label, original.scores)
    assert model.metrics().cache_hits["classify"] == {"semantic": 1}


def test_semantic_cache_needs_a_classifier_and_an_embedder(
    minilm_int8: Path, minilm_classifier: Path
) -> None:
    def semantic(embedder: Path) -> CacheConfig:
        config = SemanticCacheConfig(embedder=embedder, threshold=0.9)
        return CacheConfig(persist=False, semantic=config)

    with pytest.raises(ConfigError, match="classification"):
        edgeinfer.load(minilm_int8, cache=semantic(minilm_int8))
    with pytest.raises(ConfigError, match="not an embed package"):
        edgeinfer.load(minilm_classifier, cache=semantic(minilm_classifier))
