"""EfficientNet-Lite0 export: static QDQ int8 within its gate, the speed guard refusing dynamic
int8, the npu-qnn and gpu-cuda presets, image inputs in the runtime, the built-in image set."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

import edgeinfer
from edgeinfer.errors import ConfigError, InputError
from edgeinfer.export.data import photos
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.passes.validate import qdq_problems
from edgeinfer.export.run import export
from edgeinfer.package_io import ImageClassifierIO, ImageSpec
from edgeinfer.runtime.kinds.pictures import pictures_to_batch
from edgeinfer.runtime.tasks import prepare_images


def _top1(model: edgeinfer.Model, views: np.ndarray) -> list[str]:
    return [r.label for r in model.classify(views)]


# -- the built-in image set and the runtime's image input (fast)


def test_builtin_splits_are_deterministic_and_come_from_different_photos() -> None:
    calibration = photos.builtin_images("calibration", 6, size=64)
    gate = photos.builtin_images("gate", 30, size=64)
    assert calibration.shape == (6, 64, 64, 3) and gate.shape == (30, 64, 64, 3)
    assert calibration.dtype == np.uint8
    np.testing.assert_array_equal(gate, photos.builtin_images("gate", 30, size=64))
    calibration_photos, gate_photos = photos.photos("calibration"), photos.photos("gate")
    assert len(gate_photos) >= 12 and len(calibration_photos) >= 5
    tune_photos = photos.photos("tune")
    splits = (calibration_photos, tune_photos, gate_photos)
    for index, split in enumerate(splits):  # no photo is in two splits
        others = [p for other in splits[index + 1 :] for p in other]
        for photo in split:
            assert not any(p.shape == photo.shape and np.array_equal(p, photo) for p in others)
    # the gate starts with every whole scene, then their mirrors
    np.testing.assert_array_equal(gate[0][:, ::-1], gate[len(gate_photos)])
    turned = photos.builtin_images("gate", 4, size=64, rotate=True)
    np.testing.assert_array_equal(turned[0], gate[0])
    assert not np.array_equal(turned[1], gate[1])  # view 1 is turned by 90 degrees


def test_read_images_forms(tmp_path: Path) -> None:
    views = photos.builtin_images("gate", 3, size=32)
    np.save(tmp_path / "views.npy", views)
    np.testing.assert_array_equal(photos.read_images(tmp_path / "views.npy", size=32), views)
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(folder / "a.png")
    assert photos.read_images(folder, size=32).shape == (1, 32, 32, 3)
    with pytest.raises(ConfigError, match="uint8 RGB"):
        photos.read_images(tmp_path / "views.npy", size=16)
    with pytest.raises(ConfigError, match="does not exist"):
        photos.read_images(tmp_path / "missing", size=32)


def test_prepare_images_normalizes_and_validates() -> None:
    spec = ImageSpec(height=4, width=4, mean=(127.0,) * 3, std=(128.0,) * 3)
    hwc = np.full((4, 4, 3), 255, np.uint8)
    pixels = prepare_images(hwc, image=spec)  # one image: [1, 3, 4, 4]
    assert pixels.shape == (1, 3, 4, 4) and pixels.dtype == np.float32
    assert np.allclose(pixels, 1.0)
    np.testing.assert_array_equal(prepare_images(pixels, image=spec), pixels)  # float: as is
    with pytest.raises(InputError, match="uint8 RGB array"):
        prepare_images(np.zeros((1, 3, 4, 4), np.uint8), image=spec)
    with pytest.raises(InputError, match="float32 images"):
        prepare_images(np.zeros((1, 4, 4, 3), np.float32), image=spec)
    with pytest.raises(InputError, match="dtype int64"):
        prepare_images(np.zeros((4, 4, 3), np.int64), image=spec)
    with pytest.raises(InputError, match="does not exist"):
        prepare_images("no-such-photo.jpg", image=spec)
    bgr = prepare_images(np.array([[[10, 20, 30]]], np.uint8).repeat(4, 0).repeat(4, 1),
                         image=replace(spec, color="BGR"))  # fmt: skip
    assert np.allclose(bgr[0, :, 0, 0], (np.array([30, 20, 10]) - 127.0) / 128.0)


def test_pictures_are_resized_as_the_manifest_says(tmp_path: Path) -> None:
    """Paths, Pillow images and arrays of any size give the same pixels, resized and cropped
    as the spec says: crop, stretch, or shorter side then a center crop."""
    from PIL import Image

    photo = np.zeros((60, 100, 3), np.uint8)
    photo[:, :20] = 255  # a white band on the left: cut by a center crop, kept by a stretch
    Image.fromarray(photo).save(tmp_path / "photo.png")
    crop = ImageSpec(height=30, width=30, mean=(0.0,) * 3, std=(1.0,) * 3)
    stretch = replace(crop, resize="stretch")
    shorter = replace(crop, resize="shorter-side", shorter_side=40)
    for spec, white in ((crop, False), (stretch, True), (shorter, False)):
        from_path = pictures_to_batch(str(tmp_path / "photo.png"), image=spec)
        from_pil = pictures_to_batch([Image.fromarray(photo)], image=spec)
        from_array = pictures_to_batch(photo, image=spec)
        assert from_path.shape == (1, 30, 30, 3)
        np.testing.assert_array_equal(from_path, from_pil)
        np.testing.assert_array_equal(from_path, from_array)
        assert (from_path[0, :, 0].min() > 200) == white
    batch = pictures_to_batch(np.zeros((3, 30, 30, 3), np.uint8), image=crop)
    assert batch.shape == (3, 30, 30, 3)  # already at size: no resize
    with pytest.raises(InputError, match="not a readable image"):
        (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
        pictures_to_batch(tmp_path / "bad.jpg", image=crop)


# -- packages (exported once per session, slow)


@pytest.mark.slow
def test_static_int8_is_qdq_and_agrees_with_fp32(effnet_int8: Path, effnet_fp32: Path) -> None:
    manifest = json.loads((effnet_int8 / "manifest.json").read_text())
    quant = manifest["quantization"]
    assert (quant["mode"], quant["format"], quant["per_channel"]) == ("int8-static", "QDQ", True)
    # the recipe's sensitivity pass holds the last quarter of a user's images to tune on
    assert quant["calibration_size"] + quant["sensitivity"]["tune_inputs"] == 128
    assert set(quant["kept_fp32"]) >= {n["node"] for n in quant["sensitivity"]["float_nodes"]}
    report = json.loads((effnet_int8 / "report.json").read_text())
    assert report["variants"]["int8"]["sensitivity"] == quant["sensitivity"]
    assert manifest["io"]["image"]["mean"] == [127.0] * 3
    gate = manifest["accuracy"]
    assert gate["value"]["passed"] and gate["value"]["mean"] >= 1 - gate["max_accuracy_loss"]
    ops = {n.op_type for n in onnx.load(str(effnet_int8 / "model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    views = photos.builtin_images("gate", 4, size=224)  # four whole photos
    with edgeinfer.load(effnet_int8) as int8, edgeinfer.load(effnet_fp32) as fp32:
        assert _top1(int8, views) == _top1(fp32, views)
        pixels = prepare_images(views, image=int8.manifest.io_as(ImageClassifierIO).image)
        assert _top1(int8, pixels) == _top1(int8, views)  # float NCHW == uint8 HWC
        assert len(int8.classify(np.zeros((2, 100, 150, 3), np.uint8))) == 2  # resized
        with pytest.raises(InputError):
            int8.classify(["a text"])


@pytest.mark.slow
@pytest.mark.usefixtures("int8_measured_slower")
def test_a_slower_dynamic_int8_is_refused_with_advice(
    tmp_path: Path, few_gate_views_npy: Path
) -> None:
    """Dynamic int8 (ConvInteger) measured slower than fp32 is not shipped: the recipe keeps
    the most accurate variant that passes (fp32) and the report says why, pointing to static
    int8. (Without the recipe's keep_best it is a SlowerQuantizationError: test_choice.py.)"""
    out = tmp_path / "dynamic"
    options = ExportOptions(
        source="efficientnet-lite0",
        out=out,
        quantize="int8",
        eval_data=few_gate_views_npy,
        max_accuracy_loss=0.5,  # dynamic int8 also loses accuracy: speed is the point here
    )
    report = export(options)
    assert report.chosen == "fp32"
    assert report.variants["int8"]["speed"]["slower"] is True
    assert any("int8-static" in warning for warning in report.warnings)
    assert json.loads((out / "manifest.json").read_text())["precision"] == "fp32"


@pytest.mark.slow
def test_npu_qnn_is_pure_qdq_with_fixed_shapes(effnet_qnn: Path, effnet_fp32: Path) -> None:
    assert qdq_problems(effnet_qnn / "model.onnx") == []
    assert qdq_problems(effnet_fp32 / "model.onnx")  # dynamic batch, float compute
    manifest = json.loads((effnet_qnn / "manifest.json").read_text())
    assert manifest["io"]["inputs"][0]["shape"] == [1, 3, 224, 224]
    assert manifest["io"]["kind"] == "image-classifier"
    assert manifest["quantization"]["rules"] == "qnn"
    assert manifest["accuracy"]["value"]["passed"]
    views = photos.builtin_images("gate", 3, size=224)  # 3 images through a batch-1 graph
    with edgeinfer.load(effnet_qnn, providers=["cpu"]) as qnn, edgeinfer.load(effnet_fp32) as fp32:
        assert _top1(qnn, views) == _top1(fp32, views)


@pytest.mark.slow
def test_gpu_cuda_fp16_runs_on_cpu(
    package_root: Path, export_once: Callable[..., Path], effnet_fp32: Path
) -> None:
    out = export_once(
        package_root / "effnet-gpu-cuda",
        source="efficientnet-lite0",
        target="gpu-cuda",
        quantize="fp16",
        held_count=24,
    )
    graph = onnx.load(str(out / "model.onnx"))
    fp16 = onnx.TensorProto.FLOAT16
    assert sum(i.data_type == fp16 for i in graph.graph.initializer) > 40  # the conv weights
    manifest = json.loads((out / "manifest.json").read_text())
    assert [v["dtype"] for v in manifest["io"]["inputs"]] == ["float32"]  # fp32 I/O
    assert manifest["precision"] == "fp16" and manifest["accuracy"]["value"]["passed"]
    views = photos.builtin_images("gate", 4, size=224)
    with edgeinfer.load(out, providers=["cpu"]) as half, edgeinfer.load(effnet_fp32) as full:
        assert _top1(half, views) == _top1(full, views)
