"""``edgeinfer export mnist-cnn --early-exit``, ``edgeinfer classify`` and
``edgeinfer bench --early-exit-curve``, run through ``edgeinfer.cli.main`` (exit codes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.cli import main
from edgeinfer.export.data.digits import DigitSplit, digit_split
from edgeinfer.export.early_exit import cnn
from edgeinfer.manifest import Manifest

pytestmark = pytest.mark.slow


def test_cli_exports_a_small_early_exit_cnn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a small config of the real export: 100 images per split, one epoch (seconds)
    def small(split: str, *, limit: int | None = None) -> DigitSplit:
        return digit_split(split, limit=100)  # type: ignore[arg-type]

    monkeypatch.setattr(cnn, "digit_split", small)
    monkeypatch.setattr(cnn, "EPOCHS", 1)
    out = tmp_path / "mnist-ee"
    argv = [
        "export", "mnist-cnn", "-o", str(out), "--task", "classify", "--early-exit",
        "--train-data", "mnist", "--quantize", "none", "--threads", "2", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    manifest = Manifest.read(out)
    manifest.verify(out)
    assert manifest.early_exit is not None and manifest.early_exit["train"]["images"] == 100
    assert sorted(manifest.files) == [
        "report.json", "segment_0.onnx", "segment_1.onnx", "segment_2.onnx",
    ]  # fmt: skip
    assert not out.with_name(out.name + ".partial").exists()
    assert main([*argv[:-1]]) == 2  # the package exists: refused without --overwrite


def test_cli_classify_an_image_file(
    mnist_early_exit_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = digit_split("test", limit=4)
    path = tmp_path / "digits.npy"
    np.save(path, images.images)
    pkg = str(mnist_early_exit_package)
    assert main(["classify", pkg, "--image", str(path), "--json", "--threads", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["input"] for r in rows] == [f"digits.npy[{i}]" for i in range(4)]
    assert all(r["exit_layer"] in (1, 2, 3) and r["label"] in "0123456789" for r in rows)
    argv = ["classify", pkg, "--image", str(path), "--exit-threshold", "0", "--json"]
    assert main(argv) == 0
    assert [r["exit_layer"] for r in json.loads(capsys.readouterr().out)] == [1] * 4
    np.save(path, (images.images * 255).astype(np.uint8))
    assert main(["classify", pkg, "--image", str(path)]) == 2  # bad_input: not intensities
    assert "divide 8-bit pixels by 255" in capsys.readouterr().err
    assert main(["classify", pkg]) == 2  # nothing to classify


def test_cli_classify_a_text(early_exit_package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "The striker scored twice as the champions won the cup final."
    argv = ["classify", str(early_exit_package), text, "--exit-threshold", "0", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and rows[0]["exit_layer"] == 2 and rows[0]["input"] == text
    assert main(["classify", str(early_exit_package), text]) == 0
    assert "exit layer" in capsys.readouterr().out
    argv = ["classify", str(early_exit_package), text, "--exit-threshold", "-1"]
    assert main(argv) == 2  # a max-softmax threshold must be >= 0


def test_cli_bench_early_exit_curve(
    mnist_early_exit_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "curve.png"
    argv = [
        "bench", str(mnist_early_exit_package), "--early-exit-curve", "--limit", "60",
        "--threads", "2", "--plot", str(plot), "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert plot.stat().st_size > 1000
    assert result["split"] == "test" and result["inputs"] == 60
    spec = Manifest.read(mnist_early_exit_package).early_exit
    assert spec is not None
    assert (result["policy"], result["threshold"]) == (spec["policy"], spec["threshold"])
    measured = result["measured"]
    assert measured["inputs"] == 60 and 1.0 <= measured["mean_layers"] <= 3.0
    assert measured["full_accuracy"] == result["full_depth"]["accuracy"]
    assert measured["speedup"] > 0 and measured["full_mean_ms"] > 0
    for policy, curve in result["curves"].items():
        assert curve and all(0.0 <= p["accuracy"] <= 1.0 for p in curve), policy
    # the swept curve at the default rule gives the same accuracy as the measured run
    swept = next(p for p in result["curves"][spec["policy"]] if p["threshold"] == spec["threshold"])
    assert swept["accuracy"] == pytest.approx(measured["accuracy"], abs=1 / 60)
    assert (
        main(["bench", str(mnist_early_exit_package), "--early-exit-curve", "--limit", "20"]) == 0
    )
    assert "full depth" in capsys.readouterr().err


@pytest.mark.slow  # its packages come by name (getfixturevalue): exports
@pytest.mark.parametrize("which", ["early_exit_package", "mnist_early_exit_package"])
def test_inspect_shows_an_early_exit_package(
    which: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    package: Path = request.getfixturevalue(which)
    assert main(["inspect", str(package)]) == 0
    table = capsys.readouterr().err  # the table goes to the stderr console
    accuracy = Manifest.read(package).accuracy
    assert f"{accuracy['metric']}: {accuracy['value']:.4g}" in table
