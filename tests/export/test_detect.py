"""Detector packages (``--task detect``): a YOLO-layout graph exported as an image-detector,
its detections in the picture's own pixels, as the graph and NMS give them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx_models import yolo_like, yolox_like

import edgeinfer
from edgeinfer.export.options import ExportOptions, OnnxFileOptions

pytestmark = pytest.mark.slow  # each test runs an export


def test_a_yolo_graph_becomes_a_detector_with_boxes_in_picture_pixels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime

    from edgeinfer.export.run import export
    from edgeinfer.runtime import smoke
    from edgeinfer.runtime.kinds import detect, pictures
    from edgeinfer.runtime.tasks import prepare_images

    graph = yolo_like(tmp_path / "yolo.onnx", size=32, boxes=(32, 0, 8, 4))
    (tmp_path / "labels.txt").write_text("person\ncar\ndog\n")
    out = tmp_path / "pkg"
    labels = OnnxFileOptions(labels=tmp_path / "labels.txt")
    report = export(ExportOptions(source=str(graph), out=out, task="detect", quantize="none",
                                  held_count=8, builder=labels))  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert report.task == "detect" and manifest["io"]["kind"] == "image-detector"
    assert manifest["io"]["layout"] == "attributes-first"
    assert manifest["accuracy"]["value"]["outputs"]["output0"]["metric"] == "detection_f1"
    picture = np.random.default_rng(0).integers(0, 256, size=(48, 80, 3), dtype=np.uint8)
    with edgeinfer.load(out) as model:
        assert type(model) is edgeinfer.DetectModel and not hasattr(model, "classify")
        (found,) = model.detect(picture)
        smoke.check(model)
        spec = model.manifest.io.image  # type: ignore[union-attr]
    assert found and {d.label for d in found} <= {"person", "car", "dog"}
    assert all(0 <= d.box[0] <= d.box[2] <= 80 and 0 <= d.box[1] <= d.box[3] <= 48 for d in found)
    # the same pipeline by hand: letterbox, graph, decode + NMS, back to picture pixels
    pixels = prepare_images(pictures.fit(pictures.as_pil(picture, 0), spec)[None], image=spec)
    (output,) = onnxruntime.InferenceSession(str(graph)).run(None, {"images": pixels})
    decoded = detect.decode(output, detect.DecodeConfig())
    scale, left, top = pictures.letterbox(80, 48, spec)
    want = np.clip((decoded.boxes - [left, top, left, top]) / scale, 0, [80, 48, 80, 48])
    np.testing.assert_allclose([d.box for d in found], want, rtol=1e-5, atol=1e-3)
    assert [d.score for d in found] == pytest.approx(decoded.scores.tolist())
    from PIL import Image

    from edgeinfer.cli import main

    Image.fromarray(picture).save(tmp_path / "photo.png")
    assert main(["detect", str(out), "--image", str(tmp_path / "photo.png"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in rows] == [d.label for d in found]


def test_a_yolox_head_is_decoded_on_its_grids_with_the_given_preprocessing(tmp_path: Path) -> None:
    import onnxruntime

    from edgeinfer.export.run import export
    from edgeinfer.runtime.kinds import pictures
    from edgeinfer.runtime.tasks import prepare_images

    graph = yolox_like(tmp_path / "yolox.onnx", size=32)
    out = tmp_path / "pkg"
    image = OnnxFileOptions(image=("color=BGR", "mean=0,0,0", "std=1,1,1", "pad=top-left"))
    export(ExportOptions(source=str(graph), out=out, task="detect", quantize="none",
                         held_count=8, builder=image))  # fmt: skip
    io = json.loads((out / "manifest.json").read_text())["io"]
    assert io["layout"] == "yolox"
    assert io["image"]["pad"] == "top-left" and io["image"]["color"] == "BGR"
    rng = np.random.default_rng(1)
    picture = rng.integers(0, 256, size=(16, 32, 3), dtype=np.uint8)
    picture[:, :16] = 255  # bright cells: large boxes that score
    with edgeinfer.load(out) as model:
        (found,) = model.detect(picture)
        spec = model.manifest.io.image  # type: ignore[union-attr]
    assert found
    # by hand: top-left letterbox (scale 1: no shift), YOLOX's grid decode, score obj x class
    pixels = prepare_images(pictures.fit(pictures.as_pil(picture, 0), spec)[None], image=spec)
    assert pixels[0, 0, 0, 0] == 255 and pixels[0, :, 20, 0].tolist() == [114.0] * 3
    (raw,) = onnxruntime.InferenceSession(str(graph)).run(None, {"images": pixels})
    cells = [(x, y, s) for s in (8, 16, 32) for y in range(32 // s) for x in range(32 // s)]
    scores = raw[0, :, 4:5] * raw[0, :, 5:]
    best = int(scores.max(axis=1).argmax())
    x, y, stride = cells[best]
    cx, cy = (raw[0, best, :2] + (x, y)) * stride
    w, h = np.exp(raw[0, best, 2:4]) * stride
    want = np.clip([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 0, [32, 16, 32, 16])
    np.testing.assert_allclose(found[0].box, want, rtol=1e-5, atol=1e-3)
    assert found[0].score == pytest.approx(float(scores.max()))


def test_image_settings_are_checked_before_the_export() -> None:
    from edgeinfer.errors import ConfigError

    with pytest.raises(ConfigError, match="KEY=VALUE"):
        OnnxFileOptions(image=("height=640",))
    with pytest.raises(ConfigError, match="WIDTHxHEIGHT"):
        OnnxFileOptions(image=("size=640",))
    with pytest.raises(ConfigError, match="outside"):
        OnnxFileOptions(nms=("iou=nan",))
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        OnnxFileOptions(nms=("conf=0.3",))
    with pytest.raises(ConfigError, match="mean"):
        OnnxFileOptions(image=("mean=0,zero,0",))


def test_a_detector_of_any_size_is_fixed_at_export_and_its_nms_recorded(tmp_path: Path) -> None:
    from onnx_models import dynamic_yolo

    from edgeinfer.errors import ConfigError
    from edgeinfer.export.run import export
    from edgeinfer.runtime.kinds import pictures

    graph = dynamic_yolo(tmp_path / "dyn.onnx")
    with pytest.raises(ConfigError, match="--preprocess size=WxH") as refused:
        export(ExportOptions(source=str(graph), out=tmp_path / "no", task="detect",
                             quantize="none", held_count=8))  # fmt: skip
    assert len(str(refused.value)) < 200  # the fix, not the symbolic shapes of every tensor
    out = tmp_path / "pkg"
    settings = OnnxFileOptions(image=("size=32x24", "fill=0"), nms=("agnostic=true", "max=50"))
    report = export(ExportOptions(source=str(graph), out=out, task="auto", quantize="none",
                                  held_count=8, builder=settings))  # fmt: skip
    io = json.loads((out / "manifest.json").read_text())["io"]
    assert report.task == "detect" and io["inputs"][0]["shape"] == [1, 3, 24, 32]
    assert io["outputs"][0]["shape"] == [1, 7, 24 * 32]  # resolved by shape inference
    assert (io["agnostic"], io["max_detections"], io["image"]["fill"]) == (True, 50, 0)
    spec = edgeinfer.load(out).manifest.io.image  # type: ignore[union-attr]
    wide = np.full((10, 80, 3), 200, np.uint8)
    assert pictures.fit(pictures.as_pil(wide, 0), spec)[0, 0].tolist() == [0, 0, 0]  # the pad
    default = tmp_path / "meta"
    ultralytics = {"imgsz": "[16, 16]", "task": "detect", "names": "{0: 'a', 1: 'b', 2: 'c'}"}
    meta = dynamic_yolo(tmp_path / "meta.onnx", metadata=ultralytics)
    export(ExportOptions(source=str(meta), out=default, task="detect", quantize="none",
                         held_count=8))  # fmt: skip
    io = json.loads((default / "manifest.json").read_text())["io"]
    assert io["inputs"][0]["shape"] == [1, 3, 16, 16] and io["labels"] == ["a", "b", "c"]
    assert (io["agnostic"], io["iou_threshold"], io["image"]["fill"]) == (False, 0.45, 114)


def test_a_head_that_is_not_a_detector_s_is_refused_with_the_command_that_fits(
    tmp_path: Path,
) -> None:
    from onnx_models import dynamic_yolo

    from edgeinfer.errors import ConfigError
    from edgeinfer.export.run import export

    logits = dynamic_yolo(tmp_path / "logits.onnx", sigmoid=False)
    with pytest.raises(ConfigError, match=r"outside \[0, 1\].*--task raw"):
        export(ExportOptions(source=str(logits), out=tmp_path / "a", task="detect",
                             quantize="none", held_count=8,
                             builder=OnnxFileOptions(image=("size=16x16",))))  # fmt: skip
    names = dynamic_yolo(tmp_path / "named.onnx", metadata={"names": "{0: 'person'}"})
    with pytest.raises(ConfigError, match=r"metadata names 1 classes.*--task segment"):
        export(ExportOptions(source=str(names), out=tmp_path / "b", task="detect",
                             quantize="none", held_count=8,
                             builder=OnnxFileOptions(image=("size=16x16",))))  # fmt: skip
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
