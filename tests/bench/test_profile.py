"""``edgeinfer profile``: one request's stages and graph op types from onnxruntime's profiler,
on the MiniLM int8 package and the tiny generate package, served as the bridge serves it or
called directly, and the Chrome trace and flame PNG it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.bench.profile import profile
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError


def test_profile_of_an_embedding_request(
    minilm_int8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, flame = tmp_path / "trace.json", tmp_path / "flame.png"
    argv = ["profile", str(minilm_int8), "--text", "Profits rose at the bank.", "--threads", "2"]
    assert main([*argv, "--trace", str(trace), "--flame", str(flame), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = {s["name"]: s for s in out["stages"]}
    assert out["request"] == "embed" and out["runs"] == 1
    assert [s["name"] for s in out["stages"]][:3] == ["decode request", "tokenize", "queue"]
    assert [s["name"] for s in out["stages"]][-2:] == ["serialize reply (json)", "other"]
    assert {"graph · runtime", "pad + post-process"} <= set(stages)
    assert out["detail"]["wire"] == "json" and out["detail"]["reply_bytes"] > 384 * 4
    ops = [name for name in stages if name.startswith("graph · ") and name != "graph · runtime"]
    assert "graph · MatMulInteger" in ops or "graph · DynamicQuantizeMatMul" in ops
    assert sum(s["ms"] for s in out["stages"]) == pytest.approx(out["total_ms"], rel=0.05)
    events = json.loads(trace.read_text())["traceEvents"]
    runs = [e for e in events if e.get("name") == "model_run"]
    kernels = [e for e in events if e.get("cat") == "Node"]
    assert len(runs) == 1 and len(kernels) > 20
    request = next(e for e in events if e["name"] == "request")
    decode, serialize = (
        next(e for e in events if e["name"] == name)
        for name in ("decode request", "serialize reply (json)")
    )
    # the bridge's spans and the profiler's events share the request's clock: decode, the
    # kernels (to the profiler's microsecond), then serialize, all inside the request
    assert 0 <= decode["ts"] and decode["ts"] + decode["dur"] <= serialize["ts"]
    first = min(e["ts"] for e in kernels)
    last = max(e["ts"] + e["dur"] for e in kernels)
    assert decode["ts"] + decode["dur"] - 1 <= first and last <= serialize["ts"] + 1
    assert serialize["ts"] + serialize["dur"] <= request["dur"]
    assert flame.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(str(flame)).shape
    assert width > 600 and height > 200
    assert main([*argv, "--wire", "none", "--batching"]) == 0
    table = capsys.readouterr().err  # the console writes to stderr
    assert "graph · runtime" in table and "queue" in table and "serialize" not in table


def test_profile_of_a_generation(fast_decoder: Path) -> None:
    result = profile(
        fast_decoder, prompt="Once upon a time", max_new_tokens=6, threads=1, wire="msgpack"
    )
    assert result.request == "generate"
    names = [s.name for s in result.stages]
    assert names[0] == "decode request" and names[-2] == "serialize reply (msgpack)"
    assert result.detail["reply_bytes"] > len(result.detail["text"].encode())
    # prefill, then a run per token (fewer when prompt lookup verifies several in one run)
    assert 2 <= result.runs <= result.detail["tokens"]
    assert sum(s.ms for s in result.stages) == pytest.approx(result.total_ms, rel=0.05)
    names = {e["name"] for e in result.trace["traceEvents"]}
    assert "model_run" in names and "request" in names


def test_profile_refuses_an_input_the_package_does_not_take(fast_decoder: Path) -> None:
    with pytest.raises(ConfigError, match="--prompt"):
        profile(fast_decoder, text="hello")
    with pytest.raises(ConfigError, match="exactly one"):
        profile(fast_decoder)
    with pytest.raises(ConfigError, match="wire"):
        profile(fast_decoder, prompt="hello", wire="xml")


def test_profile_of_a_photo_as_the_bridge_gets_it(effnet_fp32: Path, tmp_path: Path) -> None:
    import sklearn.datasets

    photo = Path(sklearn.datasets.__file__).parent / "images" / "china.jpg"
    result = profile(effnet_fp32, image=photo, threads=2)
    names = [s.name for s in result.stages]
    assert result.request == "classify" and result.runs == 1 and result.detail["label"]
    assert names[0] == "decode request" and "serialize reply (json)" in names
    assert sum(s.ms for s in result.stages) == pytest.approx(result.total_ms, rel=0.05)
    bitmap = tmp_path / "photo.bmp"
    bitmap.write_bytes(b"BM" + bytes(64))
    with pytest.raises(ConfigError, match="JPEG or PNG"):
        profile(effnet_fp32, image=bitmap)


def test_flame_labels_are_cut_to_their_bars() -> None:
    from edgeinfer.bench.profile_views import _fit

    label, name = "SkipLayerNormalization 0.51 ms", "SkipLayerNormalization"
    assert _fit(label, name, 40) == label
    assert _fit(label, name, 25) == name
    assert _fit(label, name, 12) == "SkipLayerN…"  # 11 characters, one of margin
    assert _fit(label, name, 4) == ""
