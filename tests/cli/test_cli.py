"""Every CLI command, run as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.bench.runner import make_text
from edgeinfer.bench.stats import summarize
from edgeinfer.errors import ConfigError


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True, timeout=900
    )


def test_inspect_verifies_and_lists_providers(minilm_int8: Path) -> None:
    result = _cli("inspect", str(minilm_int8), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["verified"] is True
    assert "CPUExecutionProvider" in info["available_providers"]
    assert info["manifest"]["precision"] == "int8"
    table = _cli("inspect", str(minilm_int8))
    assert table.returncode == 0 and "verified" in table.stderr


def test_inspect_says_which_prompt_form_a_generate_package_expects(fast_decoder: Path) -> None:
    """The tiny decoder has a chat template: requests should be ``messages``."""
    result = _cli("inspect", str(fast_decoder), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["manifest"]["io"]["chat_format"] is not None
    assert info["prompt_form"] == "messages"
    assert "prompt form" in _cli("inspect", str(fast_decoder)).stderr


def test_inspect_refuses_a_tampered_package(minilm_int8: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    shutil.copytree(minilm_int8, pkg)
    tokenizer = pkg / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"[UNK]"', '"[UNX]"', 1))
    result = _cli("inspect", str(pkg))
    assert result.returncode == 2
    assert "integrity" in result.stderr and "tokenizer.json" in result.stderr


def test_file_backed_prepacks_are_an_option_of_the_footprint(fast_encoder: Path) -> None:
    result = _cli("inspect", str(fast_encoder), "--file-backed-prepacks")
    assert result.returncode == 2 and "add --footprint" in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert _cli("inspect", str(tmp_path)).returncode == 2
    assert _cli("bench").returncode == 2
    assert _cli("frobnicate").returncode == 2


def test_bench_against_a_package_baseline(
    minilm_int8: Path, minilm_fp32: Path, tmp_path: Path
) -> None:
    plot = tmp_path / "bench.png"
    result = _cli(
        "bench",
        str(minilm_int8),
        "--baseline",
        str(minilm_fp32),
        "--runs",
        "20",
        "--warmup",
        "2",
        "--rounds",
        "2",
        "--seq-len",
        "16",
        "--threads",
        "1",
        "--plot",
        str(plot),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["seq_len"] == 16
    subject, baseline = report["results"]
    for r in (subject, baseline):
        latency = r["latency"]
        assert latency["count"] == 20
        assert latency["min_ms"] <= latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"]
        assert r["cold_start_ms"] > 0 and r["peak_rss_mb"] > 10
    expected = baseline["latency"]["p50_ms"] / subject["latency"]["p50_ms"]
    assert report["speedup_p50"][baseline["label"]] == pytest.approx(expected, rel=1e-2)
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_bench_against_pytorch_and_a_speedup_budget(minilm_int8: Path) -> None:
    result = _cli(
        "bench",
        str(minilm_int8),
        "--baseline",
        "torch",
        "--runs",
        "10",
        "--warmup",
        "2",
        "--rounds",
        "1",
        "--min-speedup",
        "1000",
    )
    assert result.returncode == 1  # no package is 1000x faster than PyTorch: the budget fails
    assert "pytorch eager" in result.stderr and "speedup below" in result.stderr


def test_bench_text_has_the_requested_length(minilm_int8: Path) -> None:
    for seq_len in (8, 32, 128, 256):
        _, count = make_text(minilm_int8, seq_len)
        assert count == seq_len
    with pytest.raises(ConfigError, match="window"):
        make_text(minilm_int8, 1000)


def test_percentiles_on_known_samples() -> None:
    summary = summarize([float(i) for i in range(1, 101)])
    assert summary.p50_ms == pytest.approx(50.5)
    assert summary.p99_ms == pytest.approx(99.01)
    assert (summary.min_ms, summary.max_ms, summary.mean_ms) == (1.0, 100.0, 50.5)
    with pytest.raises(ConfigError):
        summarize([])


def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(
    minilm_int8: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgeinfer import manifest
    from edgeinfer.cli import main

    def broken(self: object, folder: Path) -> None:
        raise RuntimeError("a bug in verify")

    monkeypatch.setattr(manifest.Manifest, "verify", broken)
    assert main(["inspect", str(minilm_int8)]) == 2
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: a bug in verify" in " ".join(err.split())
    assert "--debug" in err and "Traceback" not in err
    assert main(["--debug", "inspect", str(minilm_int8)]) == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("EDGEINFER_DEBUG", "1")
    assert main(["inspect", str(minilm_int8)]) == 2
    assert "Traceback" in capsys.readouterr().err
