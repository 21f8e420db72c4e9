"""``edgeinfer bench PKG --concurrency 1,2``: C generations at once on the runtime's continuous
batching engine, and beside llama.cpp's server with C parallel slots."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console

from edgeinfer.bench.concurrency import concurrency_table, run_concurrency_bench
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError

_MEASURES = {
    "aggregate_tokens_per_s",
    "per_stream_tokens_per_s",
    "inter_token_ms",
    "ttft_ms",
    "identical",
    "held_back_tokens",
    "scaling",
    "steady_tokens_per_s",
    "steady_inter_token_ms_p50",
    "steady_scaling",
}


def _check_engine(levels: list[dict[str, object]], name: str) -> None:
    """Every level of ``name``: the measures, in their order, and greedy streams that equal
    their prompts run alone."""
    for level in levels:
        m = level[name]
        assert isinstance(m, dict) and set(m) == _MEASURES
        assert m["identical"] is True, (name, level["concurrency"])
        assert m["inter_token_ms"]["p50"] <= m["inter_token_ms"]["p99"]
        assert 0 < m["ttft_ms"]["p50"] <= m["ttft_ms"]["max"]
        assert 0 < m["per_stream_tokens_per_s"] and 0 < m["aggregate_tokens_per_s"]
        # measured while every stream decodes (None if no token lands inside that window)
        assert m["steady_tokens_per_s"] is None or m["steady_tokens_per_s"] > 0
    assert levels[0][name]["scaling"] == 1.0  # type: ignore[index]


def test_concurrency_bench_on_the_tiny_package(
    fast_decoder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(fast_decoder), "--concurrency", "2", "--tokens", "8", "--threads", "1"]
    assert main([*args, "--rounds", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    levels = result["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]  # 1: the solo reference
    assert len(result["prompt_tokens"]) == 2 and result["gguf"] is None
    _check_engine(levels, "ours")
    assert all("llamacpp" not in level for level in levels)
    console = Console(width=200, record=True)
    console.print(concurrency_table(result))
    rows = [line for line in console.export_text().splitlines() if fast_decoder.name in line]
    assert len(rows) == 2  # one per stream count


def test_concurrency_refuses_what_it_cannot_measure(
    fast_encoder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", str(fast_encoder), "--concurrency", "1,2"]) == 2
    assert "generate package" in capsys.readouterr().err
    for counts in ([0, 2], [1, 17]):  # checked before the package is read
        with pytest.raises(ConfigError, match="stream counts"):
            run_concurrency_bench(tmp_path, concurrency=counts, threads=1, tokens=8)


def test_concurrency_usage_errors(fast_decoder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = ["bench", str(fast_decoder), "--concurrency"]
    assert main([*bench, "1,two"]) == 2
    assert "stream counts" in capsys.readouterr().err
    assert main([*bench, "1,2", "--baseline", "torch"]) == 2
    assert "one llama.cpp file" in capsys.readouterr().err


def test_concurrency_beside_llamacpp_slots(
    smollm2_fp32_package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.fail("pip install 'edgeinfer[llamacpp]' (tools/setup.sh installs it)")
    args = ["bench", str(smollm2_fp32_package), "--concurrency", "1,2", "--tokens", "8"]
    args += ["--baseline", "llama.cpp", "--threads", "2", "--rounds", "2", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    levels = result["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    _check_engine(levels, "ours")
    _check_engine(levels, "llamacpp")
    for level in levels:
        assert level["ours_vs_llamacpp"] == pytest.approx(
            level["ours"]["aggregate_tokens_per_s"] / level["llamacpp"]["aggregate_tokens_per_s"],
            rel=0.02,
        )
