"""ONNX files as sources: the graph's form decides the package (images, token ids, raw with
state), data is read and held out as documented, and every refusal is a clear message with
exit 2 and nothing at OUT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx_models import accumulator, tiny_cnn

import edgeinfer
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError
from edgeinfer.export import labels
from edgeinfer.export.data import tensors
from edgeinfer.export.onnx_file import user_graph
from edgeinfer.export.options import ExportOptions, OnnxFileOptions
from edgeinfer.export.vision import preprocessing
from edgeinfer.package_io import RawIO, TensorSpec

X = TensorSpec("x", "float32", (1, 4))


# -- data, state and preprocessing (fast)


def test_tensor_files_become_streams_and_a_held_part(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", x=np.ones((6, 1, 4), np.float32), sr=np.array(16000))
    np.savez(tmp_path / "b.npz", x=np.zeros((6, 4), np.float32), sr=np.array(16000))
    inputs = (X, TensorSpec("sr", "int64", ()))
    stateful = tensors.read_streams(tmp_path, inputs, stateful=True)
    assert [len(s) for s in stateful] == [6, 6]  # one stream per file
    assert stateful[1][0]["x"].shape == (1, 4) and int(stateful[0][3]["sr"]) == 16000
    samples = tensors.read_streams(tmp_path / "a.npz", inputs, stateful=False)
    assert len(samples) == 6 and all(len(s) == 1 for s in samples)  # rows are samples
    calibration, held = tensors.split_held(samples)
    assert len(held) == 1 and len(calibration) == 5
    (one,) = tensors.read_streams(tmp_path / "a.npz", inputs, stateful=True)
    first, second = tensors.split_held([one])  # one stream is cut in two
    assert len(first[0]) + len(second[0]) == 6
    np.savez(tmp_path / "bad.npz", y=np.ones((2, 4), np.float32))
    with pytest.raises(ConfigError, match="the graph takes"):
        tensors.read_streams(tmp_path / "bad.npz", inputs, stateful=False)
    with pytest.raises(ConfigError, match="several inputs"):
        np.save(tmp_path / "x.npy", np.ones((2, 1, 4), np.float32))
        tensors.read_streams(tmp_path / "x.npy", inputs, stateful=False)


def test_state_pairs_are_found_by_name_or_given() -> None:
    ins = (X, TensorSpec("state", "float32", (2, 1, 8)), TensorSpec("h0", "float32", (1, 8)))
    outs = (
        TensorSpec("y", "float32", (1, 1)),
        TensorSpec("stateN", "float32", (2, 1, 8)),
        TensorSpec("hn", "float32", (1, 8)),
    )
    assert user_graph.state_pairs(ins, outs) == [("state", "stateN"), ("h0", "hn")]
    assert user_graph.state_pairs(ins, outs, ["x=y"]) == [("x", "y")]
    with pytest.raises(ConfigError, match="INPUT=OUTPUT"):
        user_graph.state_pairs(ins, outs, ["x=nothing"])
    assert user_graph.input_form((TensorSpec("pixels", "float32", ("n", 3, 8, 8)),)) == "image"
    assert user_graph.input_form((TensorSpec("input_ids", "int64", ("b", "s")),)) == "text"
    assert user_graph.input_form(ins, ["state", "h0"]) == "tensor"


def test_image_processor_configs_become_the_manifests_preprocessing(tmp_path: Path) -> None:
    def spec(config: dict[str, object]) -> object:
        (tmp_path / "p.json").write_text(json.dumps(config))
        return preprocessing.spec_from_processor(tmp_path / "p.json")

    vit = spec({"size": {"height": 224, "width": 224}, "image_mean": [0.5] * 3,
                "image_std": [0.5] * 3, "resample": 2})  # fmt: skip
    assert (vit.resize, vit.height, vit.mean[0], vit.std[0]) == ("stretch", 224, 127.5, 127.5)
    imagenet = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    convnext = spec({"size": {"shortest_edge": 224}, "crop_pct": 0.875, "resample": 3, **imagenet})
    assert (convnext.resize, convnext.shorter_side, convnext.interpolation) == (
        "shorter-side",
        256,
        "bicubic",
    )
    assert convnext.mean[0] == pytest.approx(123.675)
    mobilenet = spec({"size": {"shortest_edge": 256}, "do_center_crop": True,
                      "crop_size": {"height": 224, "width": 224}})  # fmt: skip
    assert (mobilenet.resize, mobilenet.shorter_side, mobilenet.height) == (
        "shorter-side",
        256,
        224,
    )


def test_labels_come_from_a_file_the_config_or_label_i(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n\n")
    assert labels.read_labels(tmp_path / "labels.txt", count=2) == ("cat", "dog")
    with pytest.raises(ConfigError, match="holds 2 labels, but the model has 3"):
        labels.read_labels(tmp_path / "labels.txt", count=3)
    assert labels.default_labels({}, 2) == ("LABEL_0", "LABEL_1")
    named = {"id2label": {"0": "neg", "1": "pos"}}
    assert labels.default_labels(named, 2) == ("neg", "pos")


# -- exports (slow)


@pytest.mark.slow
def test_a_stateful_onnx_graph_becomes_a_raw_package(raw_package: Path) -> None:
    manifest = json.loads((raw_package / "manifest.json").read_text())
    assert manifest["task"] == "raw" and manifest["io"]["kind"] == "raw"
    assert manifest["io"]["state"] == [
        {"input": "state", "output": "stateN", "dtype": "float32", "shape": [1, 4]}
    ]
    judged = manifest["accuracy"]["value"]["outputs"]
    assert (judged["out"]["metric"], judged["stateN"]["metric"]) == (
        "channel_agreement",
        "state_cosine",
    )
    with edgeinfer.load(raw_package) as model:
        assert isinstance(model.manifest.io, RawIO)
        x = np.ones((1, 4), np.float32)
        assert model.run({"x": x}, stream="mic")["out"].tolist() == [[2, 2, 2, 2]]
        assert model.run({"x": x}, stream="mic")["out"].tolist() == [[4, 4, 4, 4]]
        alone = model.run({"x": x})  # no stream: zero state, every output returned
        assert alone["out"].tolist() == [[2, 2, 2, 2]] and "stateN" in alone
        from edgeinfer.runtime.smoke import check

        check(model)  # the recorded smoke cases run again


@pytest.mark.slow
def test_an_onnx_image_classifier_with_labels_and_user_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    from edgeinfer.export.data.photos import builtin_images
    from edgeinfer.export.run import export

    graph = tiny_cnn(tmp_path / "cnn.onnx")
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, view in enumerate(builtin_images("calibration", 16, size=48)):
        Image.fromarray(view).save(photos / f"{i:02d}.png")
    (tmp_path / "labels.txt").write_text("cat\ndog\nbird\n")
    out = tmp_path / "pkg"
    report = export(
        ExportOptions(
            source=str(graph),
            out=out,
            quantize="int8-static",
            calibration=photos,
            force_quantize=True,
            builder=OnnxFileOptions(labels=tmp_path / "labels.txt"),
        )
    )
    assert report.task == "classify" and report.chosen == "int8"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["io"]["kind"] == "image-classifier"
    assert manifest["io"]["labels"] == ["cat", "dog", "bird"]
    assert manifest["quantization"]["calibration_size"] == 12  # 16 photos, 4 held out
    assert "held part" in manifest["accuracy"]["eval_data"]
    assert any("ImageNet's mean" in w for w in report.warnings)
    with edgeinfer.load(out) as model:
        result = model.classify(str(photos / "00.png"))[0]
        assert result.label in ("cat", "dog", "bird")
    assert main(["classify", str(out), "--image", str(photos / "00.png"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["label"] == result.label


def _refused(args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["export", *args, "-o", str(out)]) == 2
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.slow
def test_refusals_are_clear_exit_2_and_leave_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a protobuf at all")
    assert "is not an ONNX model" in _refused([str(broken)], out, capsys)
    graph = accumulator(tmp_path / "acc.onnx")
    assert "pass --eval-data" in _refused([str(graph), "--task", "raw"], out, capsys)
    message = _refused([str(graph), "--task", "classify"], out, capsys)
    assert "export it with --task raw" in message
    message = _refused([str(graph), "--task", "raw", "--metric", "out=l2"], out, capsys)
    assert "must be OUTPUT=METRIC with METRIC one of detections" in message
    data = tmp_path / "calls.npz"
    np.savez(data, x=np.ones((4, 1, 4), np.float32))
    message = _refused([str(graph), "--task", "raw", "--eval-data", str(data), "--metric",
                        "nope=tensor"], out, capsys)  # fmt: skip
    assert "--metric names ['nope']; the graph's outputs are" in message
    cnn = tiny_cnn(tmp_path / "cnn.onnx")
    (tmp_path / "two.txt").write_text("a\nb\n")
    message = _refused([str(cnn), "--labels", str(tmp_path / "two.txt")], out, capsys)
    assert "holds 2 labels, but the model has 3 classes" in message
    both = tmp_path / "both"
    both.mkdir()
    accumulator(both / "a.onnx")
    accumulator(both / "b.onnx")
    assert "several ONNX graphs" in _refused([str(both)], out, capsys)


@pytest.mark.slow
def test_an_onnx_text_folder_embeds_with_its_tokenizer(tmp_path: Path) -> None:
    """A folder as optimum writes it (model.onnx, tokenizer and config files, no weights)."""
    import shutil

    from families import TEXTS, build

    from edgeinfer.export.passes import convert
    from edgeinfer.export.run import export
    from edgeinfer.export.source import resolve_source

    folder = build("roberta", tmp_path / "roberta")
    graph = convert.to_onnx(resolve_source(str(folder)), "embed", tmp_path / "onnx")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "vocab.json"):
        shutil.copy(folder / name, graph.parent / name)
    out = tmp_path / "pkg"
    report = export(ExportOptions(source=str(graph.parent), out=out, held_count=16,
                                  force_quantize=True))  # fmt: skip
    assert (report.builder, report.task, report.chosen) == ("onnx-file", "embed", "int8")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["io"]["kind"] == "text-encoder" and manifest["io"]["max_seq_len"] == 64
    with edgeinfer.load(out) as model:
        assert model.embed(TEXTS[:2]).shape == (2, 32)


@pytest.mark.slow
def test_a_graph_of_probabilities_is_classified_with_its_own_scores(tmp_path: Path) -> None:
    import onnxruntime
    from onnx_models import softmax_classifier

    from edgeinfer.export.data.photos import builtin_images
    from edgeinfer.export.run import export
    from edgeinfer.runtime.tasks import prepare_images

    graph = softmax_classifier(tmp_path / "probs.onnx")
    out = tmp_path / "pkg"
    report = export(ExportOptions(source=str(graph), out=out, quantize="int8-static",
                                  held_count=8, force_quantize=True))  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert report.chosen == "int8" and manifest["io"]["scores"] == "probabilities"
    views = builtin_images("gate", 4, size=preprocessing.spec_from_table({}, height=8, width=8))
    with edgeinfer.load(out) as model:
        results = model.classify(views)
        pixels = prepare_images(views, image=model.manifest.io.image)  # type: ignore[union-attr]
    (probs,) = onnxruntime.InferenceSession(str(graph)).run(None, {"image": pixels})
    got = np.array([[r.scores[label] for label in ("LABEL_0", "LABEL_1", "LABEL_2")]
                    for r in results])  # fmt: skip
    np.testing.assert_allclose(got, probs, atol=0.05)  # int8's own, never softmaxed again
    assert np.allclose(got.sum(axis=1), 1, atol=0.05) and got.max() > 1 / 3 + 0.05


@pytest.mark.slow
def test_an_already_quantized_graph_ships_as_given(tmp_path: Path) -> None:
    from onnx_models import ocr_like
    from onnxruntime.quantization import quantize_dynamic

    from edgeinfer.export.run import export

    int8 = tmp_path / "rec-int8.onnx"
    quantize_dynamic(str(ocr_like(tmp_path / "rec.onnx")), str(int8))
    lines = tmp_path / "lines"
    lines.mkdir()
    for width in (5, 9, 13):
        np.savez(lines / f"{width}.npz", image=np.ones((1, 1, 8, width), np.float32))
    report = export(ExportOptions(source=str(int8), out=tmp_path / "pkg", task="raw",
                                  quantize="int8", eval_data=lines))  # fmt: skip
    assert report.chosen == "as-given" and set(report.variants) == {"as-given"}
    assert any("already quantized" in w for w in report.warnings)
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and manifest["quantization"]["mode"] == "as-given"


@pytest.mark.slow
def test_raw_smoke_cases_are_bounded_and_stored_beside_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a budget smaller than one input, inputs are regenerated from a seed and outputs
    kept as a strided sample: the arrays stay within the budget, the manifest small, and the
    check still runs them (and still catches a different graph)."""
    from onnx_models import yolo_like

    from edgeinfer.errors import PackageError
    from edgeinfer.export.run import export
    from edgeinfer.manifest import MAX_MANIFEST_BYTES
    from edgeinfer.runtime import smoke

    budget = 512  # bytes: less than one image [1, 3, 8, 8] float32 (768)
    monkeypatch.setattr(smoke, "MAX_ARRAY_BYTES", budget)
    monkeypatch.setattr(smoke, "MAX_OUTPUT_VALUES", 32)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "held.npz", images=rng.normal(size=(4, 1, 3, 8, 8)).astype(np.float32))
    out = tmp_path / "pkg"
    export(ExportOptions(source=str(yolo_like(tmp_path / "det.onnx")), out=out, task="raw",
                         quantize="none", eval_data=tmp_path / "held.npz"))  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["smoke"]["arrays"] == "smoke.npz" and "smoke.npz" in manifest["files"]
    assert (out / "manifest.json").stat().st_size < MAX_MANIFEST_BYTES
    with np.load(out / "smoke.npz") as stored:
        assert sum(stored[k].nbytes for k in stored.files) <= budget
        assert not any("/feed/" in k for k in stored.files)  # the input was regenerated
    case = manifest["smoke"]["cases"][0]
    assert case["generated"]["images"]["shape"] == [1, 3, 8, 8] and case["stride"]["output0"] > 1
    with edgeinfer.load(out) as model:
        smoke.check(model)
    other = tmp_path / "other"
    export(ExportOptions(source=str(yolo_like(tmp_path / "det2.onnx", classes=4)), out=other,
                         task="raw", quantize="none", eval_data=tmp_path / "held.npz"))  # fmt: skip
    (other / "smoke.npz").write_bytes((out / "smoke.npz").read_bytes())
    with edgeinfer.load(other, verify=False) as model, pytest.raises(PackageError):
        smoke.check(model)


@pytest.mark.slow
def test_a_convolutional_graph_under_dynamic_int8_ships_fp32_and_says_to_use_static(
    tmp_path: Path,
) -> None:
    """Dynamic int8 leaves convolutions fp32: the report says so and names int8-static (it
    listed Conv among the operators it takes, on PP-OCR's text detector)."""
    from onnx_models import text_map

    from edgeinfer.export.run import export

    pages = tmp_path / "pages"
    pages.mkdir()
    rng = np.random.default_rng(0)
    for height, width in ((16, 24), (32, 16), (24, 24)):
        np.savez(pages / f"{height}x{width}.npz", x=rng.normal(size=(1, 1, 3, height, width)))
    graph = text_map(tmp_path / "det.onnx")
    report = export(ExportOptions(source=str(graph), out=tmp_path / "pkg", task="raw",
                                  quantize="int8", eval_data=pages))  # fmt: skip
    assert report.chosen == "fp32" and set(report.variants) == {"fp32"}
    assert any("convolutions stay fp32" in w and "int8-static" in w for w in report.warnings)


def test_constant_values_in_external_data_are_read_inline_before_preprocessing(
    tmp_path: Path,
) -> None:
    """onnxruntime's quantization pre-processing loses a Constant node's external value (it
    re-saves only initializers beside the model; PP-OCR's recognizer saved with its weights
    beside it stopped there): those values are read inline first, the outputs unchanged."""
    import onnx
    import onnxruntime
    from onnx_models import ocr_like

    from edgeinfer.export import package
    from edgeinfer.export.passes import ort_compat

    (tmp_path / "model").mkdir()
    graph = ocr_like(tmp_path / "model" / "rec.onnx", external=True, constant_weights=True)
    assert package.external_data_files(graph) == ["rec.onnx.data"]  # held by the Constant
    inline = ort_compat.inline_attribute_data(graph, tmp_path / "inline.onnx")
    model = onnx.load(str(inline), load_external_data=False)
    assert inline != graph and not package.external_data_files(inline)
    assert all(
        t.data_location != onnx.TensorProto.EXTERNAL for t in package.node_tensors(model.graph)
    )
    line = {"image": np.random.default_rng(0).uniform(size=(1, 1, 8, 11)).astype(np.float32)}
    (want,) = onnxruntime.InferenceSession(str(graph)).run(None, line)
    (got,) = onnxruntime.InferenceSession(str(inline)).run(None, line)
    np.testing.assert_array_equal(want, got)
    plain = ocr_like(tmp_path / "plain.onnx")
    assert ort_compat.inline_attribute_data(plain, tmp_path / "unused.onnx") == plain


def test_click_captchas_are_seeded_and_made_at_the_packages_size() -> None:
    from edgeinfer.export.data.captchas import captcha_views, click_captchas
    from edgeinfer.package_io import ImageSpec

    first, again = click_captchas("gate", 2), click_captchas("gate", 2)
    assert [np.asarray(p).tobytes() for p in first] == [np.asarray(p).tobytes() for p in again]
    other = click_captchas("gate", 2, seed=7)
    assert np.asarray(other[0]).tobytes() != np.asarray(first[0]).tobytes()
    spec = ImageSpec(height=64, width=96, mean=(0.0,) * 3, std=(1.0,) * 3, resize="letterbox",
                     pad="top-left")  # fmt: skip
    views = captcha_views("calibration", 3, size=spec)
    assert views.shape == (3, 64, 96, 3) and views.dtype == np.uint8
    assert (views[:, -4:] == 114).all()  # 340 x 170 fits 96 x 48: gray below, top-left


@pytest.mark.slow
def test_image_settings_apply_over_the_folders_image_processor(tmp_path: Path) -> None:
    from edgeinfer.export.run import export

    folder = tmp_path / "cnn"
    folder.mkdir()
    tiny_cnn(folder / "model.onnx", size=32)
    processor = {"size": {"height": 32, "width": 32}, "image_mean": [0.5] * 3,
                 "image_std": [0.5] * 3}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    export(ExportOptions(source=str(folder), out=tmp_path / "pkg", task="classify",
                         quantize="none", held_count=8,
                         builder=OnnxFileOptions(image=("color=BGR",))))  # fmt: skip
    image = json.loads((tmp_path / "pkg" / "manifest.json").read_text())["io"]["image"]
    assert image["color"] == "BGR"  # the setting
    assert (image["mean"], image["resize"]) == ([127.5] * 3, "stretch")  # the processor's
