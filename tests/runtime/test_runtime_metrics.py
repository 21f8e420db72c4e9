"""Metrics: percentiles on known samples, the ring window, snapshots, Prometheus text."""

from __future__ import annotations

from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.runtime.metrics import LatencyWindow, Metrics, render_prometheus


def test_percentiles_on_known_samples() -> None:
    window = LatencyWindow(capacity=1000)
    for value in range(100, 0, -1):  # 100 .. 1, order must not matter
        window.record(float(value))
    s = window.summary()
    assert (s.p50_ms, s.p95_ms, s.p99_ms, s.max_ms) == (50.0, 95.0, 99.0, 100.0)
    assert (s.count, s.sum_ms) == (100, 5050.0)


def test_window_keeps_the_most_recent_samples_and_cumulative_totals() -> None:
    window = LatencyWindow(capacity=100)
    for value in range(1, 201):
        window.record(float(value))
    s = window.summary()
    assert (s.p50_ms, s.p99_ms, s.max_ms) == (150.0, 199.0, 200.0)  # over 101 .. 200
    assert (s.count, s.sum_ms) == (200, 20100.0)
    assert LatencyWindow().summary().count == 0


def test_snapshot_counts_and_hit_rate() -> None:
    metrics = Metrics(model="m")
    metrics.observe("embed", "end_to_end", 2.0)
    metrics.observe_many("embed", "compute", [1.0, 3.0])
    metrics.count_cache("embed", hits={"memory": 3, "disk": 1}, misses=4)
    metrics.count_exit("classify", 3)
    snap = metrics.snapshot()
    assert snap.latency_ms["embed"]["compute"].count == 2
    assert snap.cache_hits == {"embed": {"disk": 1, "memory": 3}}
    assert snap.hit_rate("embed") == 0.5 and snap.hit_rate("classify") == 0.0
    assert snap.early_exits == {"classify": {3: 1}}
    assert snap.cold_start_ms is None
    assert snap.to_dict()["cache_misses"] == {"embed": 4}


def test_prometheus_text_exposition() -> None:
    metrics = Metrics(model='say "hi"\\now')
    for value in range(1, 101):
        metrics.observe("embed", "compute", float(value))
    metrics.count_cache("embed", hits={"memory": 2}, misses=1)
    text = render_prometheus([metrics.snapshot()])
    assert text.endswith("\n")
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    model = r'model="say \"hi\"\\now"'
    base = f'{model},task="embed",stage="compute"'
    assert float(samples[f'edgeinfer_latency_seconds{{{base},quantile="0.99"}}']) == 0.099
    assert float(samples[f"edgeinfer_latency_seconds_sum{{{base}}}"]) == pytest.approx(5.05)
    assert samples[f"edgeinfer_latency_seconds_count{{{base}}}"] == "100"
    assert samples[f'edgeinfer_cache_hits_total{{{model},task="embed",tier="memory"}}'] == "2"
    assert samples[f'edgeinfer_cache_misses_total{{{model},task="embed"}}'] == "1"
    assert "# TYPE edgeinfer_latency_seconds summary" in text


def test_model_records_latencies_cold_start_and_cache_counts(minilm_int8: Path) -> None:
    model = edgeinfer.load(minilm_int8, cache=edgeinfer.CacheConfig(persist=False))
    # one meaning of cold start: load() called -> warm, the same in both places
    assert model.metrics().cold_start_ms == model.cold_start_ms
    assert model.cold_start_ms >= sum(model.load_breakdown_ms.values())
    model.embed(["one text", "two texts"])
    model.embed("one text")
    snap = model.metrics()
    latency = snap.latency_ms["embed"]
    assert latency["end_to_end"].count == 2 and latency["tokenize"].count == 2
    assert latency["compute"].count == 2  # per text that ran the graph
    assert snap.cache_hits == {"embed": {"memory": 1}} and snap.cache_misses == {"embed": 2}
    assert 'edgeinfer_cold_start_seconds{model="minilm"}' in render_prometheus([snap])


def test_prometheus_takes_models_as_well_as_snapshots(fast_encoder: Path) -> None:
    """``render_prometheus([model])`` as the README writes it: a model stands for its
    snapshot (it raised AttributeError: no ``latency_ms`` on a model)."""
    with edgeinfer.load(fast_encoder, threads=1) as model:
        model.embed(["pump pressure rising"])
        from_model = render_prometheus([model])
        assert from_model == render_prometheus([model.metrics()])
    assert 'edgeinfer_latency_seconds_count{model="tiny-encoder",task="embed"' in from_model
    assert "edgeinfer_cold_start_seconds" in from_model
