"""Early exit: the segment chain, the exit decision, the calibrated curve, the plain path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.export.data.topics import labelled_split
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.kinds.early_exit import SegmentRunner, first_exit, passes
from edgeinfer.runtime.kinds.exit_curve import NEVER_EXIT
from edgeinfer.runtime.tokenizer import TextTokenizer

TEXTS = [
    "Shares in the bank fell after profits missed forecasts.",
    "The striker scored twice as the champions won the cup final on Saturday.",
    "Ministers will publish the bill on immigration before the general election, "
    "the prime minister's spokesman said, as opposition parties demanded a vote.",
    "A new mobile phone chip promises longer battery life.",
]


def _runner(package: Path) -> tuple[SegmentRunner, TextTokenizer]:
    manifest = Manifest.read(package)
    runner = SegmentRunner(package, manifest, config=RuntimeConfig(threads=2, warmup_runs=0))
    tokenizer = TextTokenizer.for_package(package, manifest)
    return runner, tokenizer


def _onehot_logits(confidence: list[float]) -> np.ndarray:
    """Logits [B, 5] whose max softmax probability is exactly ``confidence[b]``."""
    rows = []
    for p in confidence:
        rest = (1.0 - p) / 4
        rows.append(np.log([p, rest, rest, rest, rest]))
    return np.asarray(rows, dtype=np.float32)


def test_decision_stops_at_the_first_head_over_the_threshold() -> None:
    exits = [
        _onehot_logits([0.5, 0.9, 0.3, 0.3]),
        _onehot_logits([0.95, 0.95, 0.85, 0.3]),
        _onehot_logits([0.99, 0.99, 0.99, 0.5]),
    ]
    assert passes(exits[0], 0.8).tolist() == [False, True, False, False]
    # row 0 passes only at exit 1; row 1 already at exit 0; row 2 at exit 1 (0.85 >= 0.8);
    # row 3 never passes, so the last (full-depth) head answers
    assert first_exit(exits, 0.8).tolist() == [1, 0, 1, 2]
    assert first_exit(exits, 0.0).tolist() == [0, 0, 0, 0]
    assert first_exit(exits, NEVER_EXIT).tolist() == [2, 2, 2, 2]


def test_chain_without_exit_equals_the_full_model(early_exit_package: Path) -> None:
    import onnx
    import torch
    from onnx import numpy_helper
    from transformers import AutoModel, AutoTokenizer

    from edgeinfer.export.source import resolve_source

    runner, tokenizer = _runner(early_exit_package)
    ids, mask = tokenizer.encode(TEXTS)
    trace = runner.trace(ids, mask)
    exit_index, logits = runner.run(ids, mask, threshold=NEVER_EXIT)
    assert exit_index.tolist() == [len(runner.sessions) - 1] * len(TEXTS)
    np.testing.assert_array_equal(logits, trace.logits[-1])

    # the full-depth head on the full PyTorch model: all 6 layers, mean pooling, the last head
    last = onnx.load(str(early_exit_package / runner_graph(early_exit_package, -1)))
    weights = {i.name: numpy_helper.to_array(i) for i in last.graph.initializer}
    source = resolve_source("minilm").path
    model = AutoModel.from_pretrained(str(source)).eval()
    batch = AutoTokenizer.from_pretrained(str(source))(
        TEXTS, padding=True, truncation=True, max_length=128, return_tensors="pt"
    )
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).float()
        pooled = ((hidden * m).sum(1) / m.sum(1)).numpy()
    expected = pooled @ weights["head.weight"].T + weights["head.bias"]
    np.testing.assert_allclose(logits, expected, atol=1e-3, rtol=1e-3)


def runner_graph(package: Path, index: int) -> str:
    spec = Manifest.read(package).early_exit
    assert spec is not None
    return str(spec["segments"][index]["graph"])


def test_batch_policies_give_the_same_answers(early_exit_package: Path) -> None:
    runner, tokenizer = _runner(early_exit_package)
    ids, mask = tokenizer.encode(TEXTS)
    trace = runner.trace(ids, mask)
    for tau in (0.3, runner.default_threshold, 0.9, 0.999):
        leave = runner.run(ids, mask, threshold=tau, policy="leave")
        full = runner.run(ids, mask, threshold=tau, policy="all")
        assert leave[0].tolist() == full[0].tolist() == first_exit(trace.logits, tau).tolist()
        np.testing.assert_allclose(leave[1], full[1], atol=1e-4)


def test_thresholds_zero_and_above_one_on_the_real_package(early_exit_package: Path) -> None:
    spec = Manifest.read(early_exit_package).early_exit
    assert spec is not None
    layers = [s["exit_layer"] for s in spec["segments"]]
    assert layers == [2, 4, 6]
    with edgeinfer.load(early_exit_package, threads=2) as model:
        first = model.classify(TEXTS, exit_threshold=0.0)
        full = model.classify(TEXTS, exit_threshold=1.5)
        assert [r.exit_layer for r in first] == [2] * len(TEXTS)
        assert [r.exit_layer for r in full] == [6] * len(TEXTS)
        default = model.classify(TEXTS)
        assert all(r.exit_layer in layers for r in default)
        counted = model.metrics().early_exits["classify"]
        assert counted[2] >= len(TEXTS) and counted[6] >= len(TEXTS)
        assert sum(counted.values()) == 3 * len(TEXTS)
        with pytest.raises(ConfigError):
            model.classify(TEXTS, exit_threshold=-0.1)


def test_manifest_curve_is_consistent(early_exit_package: Path) -> None:
    spec = Manifest.read(early_exit_package).early_exit
    assert spec is not None
    curve = sorted(spec["curves"]["max_softmax"], key=lambda p: p["threshold"])
    layers = [p["mean_layers"] for p in curve]
    assert layers == sorted(layers)  # a higher threshold never exits earlier
    assert curve[-1]["mean_layers"] == 6.0 and curve[-1] == spec["full_depth"]
    default = spec["default"]
    assert default["threshold"] == spec["threshold"] and default in spec["curve"]
    assert spec["curve"] == spec["curves"][spec["policy"]]

    def within(p: dict[str, float]) -> bool:
        return bool(p["losses"] <= spec["max_accuracy_loss"] + 1e-9)

    assert within(default)
    assert default["accuracy"] >= spec["full_depth"]["accuracy"] - spec["max_accuracy_loss"]
    every = [p for c in spec["curves"].values() for p in c]
    assert not any(within(p) for p in every if p["mean_layers"] < default["mean_layers"])


def test_curve_reproduces_at_runtime(early_exit_package: Path) -> None:
    spec = Manifest.read(early_exit_package).early_exit
    assert spec is not None
    split = labelled_split("validation", limit=spec["validation"]["articles_limit"])
    assert len(split.texts) == spec["validation"]["texts"]
    with edgeinfer.load(early_exit_package, threads=2) as model:
        results = model.classify(split.texts, batch_size=8)
    labels = [split.topics[i] for i in split.labels]
    accuracy = float(np.mean([r.label == y for r, y in zip(results, labels, strict=True)]))
    mean_layers = float(np.mean([r.exit_layer for r in results]))
    # batched padding changes float rounding, so a text near the threshold may flip: 2 of them
    noise = 2 / len(split.texts)
    assert abs(accuracy - spec["default"]["accuracy"]) <= noise
    assert abs(mean_layers - spec["default"]["mean_layers"]) <= 4 * noise * 2


def test_package_without_exits_still_classifies(minilm_classifier: Path) -> None:
    with edgeinfer.load(minilm_classifier, threads=2) as model:
        assert model.manifest.early_exit is None
        results = model.classify(TEXTS)
        assert len(results) == len(TEXTS)
        assert all(r.exit_layer is None for r in results)
        assert all(abs(sum(r.scores.values()) - 1.0) < 1e-4 for r in results)
        assert all(r.label == max(r.scores, key=r.scores.__getitem__) for r in results)
        with pytest.raises(ConfigError, match="no exit heads"):
            model.classify(TEXTS, exit_threshold=0.5)


def test_a_bad_early_exit_request_is_refused(tmp_path: Path) -> None:
    from edgeinfer.export.options import EarlyExitOptions, ExportOptions
    from edgeinfer.export.run import export

    out = tmp_path / "x"
    with pytest.raises(ConfigError, match="--task classify"):
        export(ExportOptions(source="minilm", out=out, builder=EarlyExitOptions()))
    with pytest.raises(ConfigError, match="train-data"):
        options = EarlyExitOptions(train_data="mnist")
        export(ExportOptions(source="minilm", out=out, task="classify", builder=options))
    with pytest.raises(ConfigError, match="exit_every"):
        EarlyExitOptions(exit_every=0)
    assert not out.exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_export_refuses_early_exit_without_classify(tmp_path: Path) -> None:
    result = _cli(
        "export", "minilm", "-o", str(tmp_path / "x"), "--task", "embed", "--early-exit",
        "--train-data", "bbc",
    )  # fmt: skip
    assert result.returncode == 2
    assert "--task classify" in result.stderr + result.stdout
    assert not (tmp_path / "x").exists()


def test_cli_inspect_shows_the_exit_curve(early_exit_package: Path) -> None:
    result = _cli("inspect", str(early_exit_package), "--json")
    assert result.returncode == 0, result.stderr
    early_exit = json.loads(result.stdout)["manifest"]["early_exit"]
    assert early_exit["threshold"] == early_exit["default"]["threshold"]
