"""Segmenter packages (``--task segment``): a YOLO-seg graph is read before it is judged (refused
as a detector, with the command that fits), shipped as instances whose masks are the graph's
own in the picture's pixels, and gated on mask IoU; a per-pixel classifier ships as semantic
masks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx_models import saliency_like, semantic_like, yolo_seg_like

import edgeinfer
from edgeinfer.errors import ConfigError
from edgeinfer.export.options import ExportOptions

pytestmark = pytest.mark.slow  # each test runs an export

ULTRALYTICS_META = {"task": "segment", "names": "{0: 'thing'}", "imgsz": "[32, 32]"}


def _export(graph: Path, out: Path, **kwargs: object) -> object:
    from edgeinfer.export.run import export

    options = {"quantize": "none", "held_count": 8, **kwargs}
    return export(ExportOptions(source=str(graph), out=out, **options))  # type: ignore[arg-type]


def _by_hand(graph: Path, picture: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best anchor's box, its mask at the graph's input size (sigmoid of its coefficients
    times the prototypes, upsampled, inside the box, >= 0.5) and every score, from the graph
    itself (a 32 x 32 picture: the letterbox is the identity)."""
    import onnxruntime
    from PIL import Image

    pixels = picture.transpose(2, 0, 1)[None].astype(np.float32) / 255.0
    head, protos = onnxruntime.InferenceSession(str(graph)).run(None, {"images": pixels})
    rows = head[0].T  # [N, 4 + 1 + K]
    best = int(rows[:, 4].argmax())
    cx, cy, w, h = rows[best, :4]
    box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    logit = rows[best, 5:] @ protos[0].reshape(protos.shape[1], -1)
    plane = Image.fromarray(logit.reshape(protos.shape[2:]).astype(np.float32), mode="F")
    up = np.asarray(plane.resize((32, 32), Image.Resampling.BILINEAR))
    ys, xs = np.mgrid[0:32, 0:32]
    inside = (xs >= box[0]) & (xs < box[2]) & (ys >= box[1]) & (ys < box[3])  # crop_mask
    return box, inside & (1 / (1 + np.exp(-up)) >= 0.5), rows[:, 4]


def test_a_yolo_seg_graph_is_refused_as_a_detector_and_ships_as_instances(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = yolo_seg_like(tmp_path / "seg.onnx", metadata=ULTRALYTICS_META)
    with pytest.raises(ConfigError, match="--task segment") as refused:
        _export(graph, tmp_path / "as-detector", task="detect")
    assert "mask prototypes (output1)" in str(refused.value) and len(str(refused.value)) < 300
    assert not (tmp_path / "as-detector").exists()
    out = tmp_path / "pkg"
    report = _export(graph, out, task="auto")  # a YOLO head with prototypes: segment
    manifest = json.loads((out / "manifest.json").read_text())
    io = manifest["io"]
    assert report.task == "segment" and io["kind"] == "image-segmenter"  # type: ignore[attr-defined]
    assert (io["mode"], io["coefficients"], io["prototypes"]) == ("instances", 4, "output1")
    assert io["labels"] == ["thing"]  # the metadata's names
    judged = manifest["accuracy"]["value"]["outputs"]["output0"]
    assert judged["metric"] == "mask_iou" and "fp32 masks in 8 pictures" in judged["decided_by"]
    head = manifest["accuracy"]["value"]["evidence"]["head"]
    assert (head["classes"], head["mask_coefficients"], head["prototype_output"]) == (
        1,
        4,
        "output1",
    )
    assert 0 <= head["score_range"][0] <= head["score_range"][1] <= 1
    picture = np.random.default_rng(3).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    with edgeinfer.load(out) as model:
        assert type(model) is edgeinfer.SegmentModel
        (found,) = model.segment(picture)
    box, want, scores = _by_hand(graph, picture)
    assert found and found[0].score == pytest.approx(float(scores.max()), rel=1e-5)
    np.testing.assert_allclose(found[0].box, np.clip(box, 0, 32), atol=1e-3)
    got = found[0].full(32, 32)
    assert (got == want).all() and got.sum() > 0
    from PIL import Image

    from edgeinfer.cli import main

    Image.fromarray(picture).save(tmp_path / "photo.png")
    assert main(["segment", str(out), "--image", str(tmp_path / "photo.png"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in rows] == [s.label for s in found]
    assert rows[0]["mask"]["size"] == list(found[0].mask.shape)
    assert sum(rows[0]["mask"]["counts"]) == found[0].mask.size


def test_a_segmenter_int8_is_gated_on_mask_iou(tmp_path: Path) -> None:
    graph = yolo_seg_like(tmp_path / "seg.onnx", metadata=ULTRALYTICS_META)
    report = _export(graph, tmp_path / "pkg", task="segment", quantize="int8-static",
                     keep_best=True)  # fmt: skip
    variants = report.variants  # type: ignore[attr-defined]
    scores = {name: v["accuracy"]["outputs"]["output0"] for name, v in variants.items()}
    assert scores["fp32"]["value"] == 1.0 and scores["fp32"]["metric"] == "mask_iou"
    int8 = scores["int8"]
    assert int8["metric"] == "mask_iou" and int8["floor"] == 0.95 and int8["fp32_masks"] >= 10
    assert int8["passed"] == (int8["value"] >= 0.95)


def test_a_per_pixel_classifier_ships_one_mask_per_label(tmp_path: Path) -> None:
    graph = semantic_like(tmp_path / "sem.onnx", classes=3)
    (tmp_path / "labels.txt").write_text("red\ngreen\nblue\n")
    out = tmp_path / "pkg"
    from edgeinfer.export.options import OnnxFileOptions

    labels = OnnxFileOptions(labels=tmp_path / "labels.txt")
    _export(graph, out, task="segment", builder=labels)
    io = json.loads((out / "manifest.json").read_text())["io"]
    assert (io["kind"], io["mode"], io["image"]["resize"]) == (
        "image-segmenter",
        "semantic",
        "stretch",
    )
    picture = np.zeros((40, 60, 3), np.uint8)
    picture[:, :30, 0] = 255  # red left half
    picture[:, 30:, 2] = 255  # blue right half
    with edgeinfer.load(out) as model:
        (found,) = model.segment(picture)
    masks = {s.label: s.full(60, 40) for s in found}
    assert set(masks) == {"red", "blue"}
    assert masks["red"][:, :28].all() and not masks["red"][:, 32:].any()
    assert masks["blue"][:, 32:].all() and not (masks["red"] & masks["blue"]).any()


def test_a_one_channel_probability_map_ships_background_and_foreground(tmp_path: Path) -> None:
    """U-2-Net's layout (a Sigmoid map [1, 1, h, w] first, side outputs after): the two
    classes 1 - p and p, foreground where p > 0.5 of the first output; --task segment had
    refused it ("--task raw") for having fewer than two classes."""
    out = tmp_path / "pkg"
    _export(saliency_like(tmp_path / "u2.onnx"), out, task="segment")
    io = json.loads((out / "manifest.json").read_text())["io"]
    assert (io["mode"], io["labels"]) == ("semantic", ["background", "foreground"])
    picture = np.zeros((40, 60, 3), np.uint8)
    picture[10:30, 20:50, 0] = 255  # a red block on black
    with edgeinfer.load(out) as model:
        (found,) = model.segment(picture)
    masks = {s.label: s.full(60, 40) for s in found}
    assert set(masks) == {"background", "foreground"}
    assert masks["foreground"][12:28, 22:48].all() and masks["foreground"].sum() <= 20 * 30 + 60
    assert not (masks["foreground"] & masks["background"]).any()
    assert (masks["foreground"] | masks["background"]).all()
