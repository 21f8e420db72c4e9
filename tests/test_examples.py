"""Every example is a runnable script with main(argv) -> int; run each on a real package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from mosquitto import running_mosquitto

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_semantic_search(minilm_int8: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("semantic_search").main(["--package", str(minilm_int8)]) == 0
    out = capsys.readouterr().out
    assert "embedded 300 headlines" in out and "questions" in out
    assert (
        _load("semantic_search").main(
            ["--package", str(minilm_int8), "--top", "1", "a football match"]
        )
        == 0
    )


def test_control_loop(
    minilm_int8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_mosquitto(tmp_path / "mosquitto") as broker:  # a real mosquitto, loopback
        code = _load("control_loop").main(
            ["--broker", broker.url, "--package", str(minilm_int8), "--seconds", "1"]
        )
    out = capsys.readouterr().out
    assert code == 0, out
    # 1 s at 20 Hz: every reading got exactly one outcome at the actuator (reply or fallback).
    assert "readings sent: 20 at 20 Hz, deadline 50 ms; accounted for: 20/20" in out
    assert "deadline hit rate: " in out and "latency ms" in out and " p99 " in out
    assert "actions: " in out and "label matched the simulated state: " in out


def test_every_example_is_tested() -> None:
    """Each examples/NAME.py has a test_NAME in this file."""
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert {p.stem for p in EXAMPLES.glob("*.py")} <= tested
