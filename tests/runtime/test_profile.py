"""``edgeinfer profile``: one request's stages and graph op types from onnxruntime's profiler,
on the MiniLM int8 package and the tiny generate package, and the Chrome trace it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer.errors import ConfigError
from edgeinfer.runtime.profile import profile


def test_profile_of_an_embedding_request(
    minilm_int8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    argv = ["profile", str(minilm_int8), "--text", "Profits rose at the bank.", "--threads", "2"]
    assert main([*argv, "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = {s["name"]: s for s in out["stages"]}
    assert out["request"] == "embed" and out["runs"] == 1
    assert {"tokenize", "graph · runtime", "pad + post-process", "other"} <= set(stages)
    ops = [name for name in stages if name.startswith("graph · ") and name != "graph · runtime"]
    assert "graph · MatMulInteger" in ops or "graph · DynamicQuantizeMatMul" in ops
    assert sum(s["ms"] for s in out["stages"]) == pytest.approx(out["total_ms"], rel=0.05)
    events = json.loads(trace.read_text())["traceEvents"]
    runs = [e for e in events if e.get("name") == "model_run"]
    kernels = [e for e in events if e.get("cat") == "Node"]
    assert len(runs) == 1 and len(kernels) > 20
    request = next(e for e in events if e["name"] == "request")
    assert all(0 <= e["ts"] and e["ts"] + e["dur"] <= request["dur"] + 1e3 for e in kernels)
    assert main(argv) == 0
    assert "graph · runtime" in capsys.readouterr().err  # the console writes to stderr


def test_profile_of_a_generation(tiny_package: Path) -> None:
    result = profile(tiny_package, prompt="Once upon a time", max_new_tokens=6, threads=1)
    assert result.request == "generate"
    # prefill, then a run per token (fewer when prompt lookup verifies several in one run)
    assert 2 <= result.runs <= result.detail["tokens"]
    assert sum(s.ms for s in result.stages) == pytest.approx(result.total_ms, rel=0.05)
    names = {e["name"] for e in result.trace["traceEvents"]}
    assert "model_run" in names and "request" in names


def test_profile_refuses_an_input_the_package_does_not_take(tiny_package: Path) -> None:
    with pytest.raises(ConfigError, match="--prompt"):
        profile(tiny_package, text="hello")
    with pytest.raises(ConfigError, match="exactly one"):
        profile(tiny_package)
