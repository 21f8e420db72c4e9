"""``edgeinfer generate``: run through the CLI's own error handling on the tiny package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.cli import main


def test_generate_json_matches_stream(
    fast_decoder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "generate",
        str(fast_decoder),
        "Hello there",
        "--max-new-tokens",
        "12",
        "--threads",
        "1",
    ]
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["finish_reason"] in ("eos", "length") and result["prompt_tokens"] > 0
    assert main([*args, "--stream"]) == 0
    assert capsys.readouterr().out == result["text"] + "\n"


def test_generate_chat_sampling_and_errors(
    fast_decoder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", str(fast_decoder), "Hi", "--chat", "--temperature", "0.8", "--top-p", "0.9"]
    seeded = [*args, "--seed", "5", "--max-new-tokens", "8", "--json", "--threads", "1"]
    assert main(seeded) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(seeded) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["text"], again["token_ids"]) == (first["text"], first["token_ids"])
    too_long = ["generate", str(fast_decoder), "Hi", "--max-new-tokens", "100000"]
    assert main(too_long) == 2  # ContextLengthExceededError: a usage error
    assert "context_length" in capsys.readouterr().err


def test_bench_a_generate_package_against_pytorch(
    tiny_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "gen.png"
    args = ["bench", str(tiny_package), "--baseline", "torch", "--tokens", "8", "--threads", "1"]
    args += ["--rounds", "2"]
    assert main([*args, "--json", "--plot", str(plot)]) == 0
    result = json.loads(capsys.readouterr().out)
    (row,) = result["packages"]
    assert row["decode_tokens_per_s"] > 0 and row["ttft_ms"] > 0
    p = row["inter_token_ms"]
    assert p["p50"] <= p["p95"] <= p["p99"]
    assert 0 < row["roofline_fraction"] and row["python_overhead_us_per_token"] >= 0
    # RSS after loading and after the rounds, each at most the process's peak
    assert 0 < row["loaded_rss_mb"] <= row["peak_rss_mb"]
    assert 0 < row["rss_after_run_mb"] <= row["peak_rss_mb"]
    assert result["torch"]["decode_tokens_per_s"] > 0
    (speedup,) = result["speedup_tokens_per_s"].values()
    expected = row["decode_tokens_per_s"] / result["torch"]["decode_tokens_per_s"]
    assert speedup == pytest.approx(expected, rel=0.02)
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main([*args, "--min-speedup", "1e6"]) == 1  # a budget no package meets
