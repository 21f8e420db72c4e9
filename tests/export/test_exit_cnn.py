"""The early-exit CNN on MNIST: segments, image input checks, the calibrated curve at runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config import CacheConfig, RuntimeConfig
from edgeinfer.errors import ConfigError, InputError
from edgeinfer.export.data.digits import digit_split
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.kinds.early_exit import EXIT_POLICIES, SegmentRunner, first_exit
from edgeinfer.runtime.kinds.exit_curve import NEVER_EXIT

pytestmark = pytest.mark.slow


def test_image_splits_are_disjoint_and_balanced() -> None:
    train, validation, test = (digit_split(s) for s in ("train", "validation", "test"))
    assert (len(train.labels), len(validation.labels), len(test.labels)) == (3000, 1000, 1000)
    for split in (train, validation, test):
        assert split.images.dtype == np.float32 and split.images.shape[1:] == (1, 28, 28)
        assert 0.0 <= split.images.min() and split.images.max() <= 1.0
        assert np.bincount(split.labels).min() >= 0.05 * len(split.labels)  # every digit
    seen = {img.tobytes() for img in train.images}
    assert not any(img.tobytes() in seen for img in test.images[:200])


def test_manifest_describes_image_segments(mnist_early_exit_package: Path) -> None:
    manifest = Manifest.read(mnist_early_exit_package)
    spec = manifest.early_exit
    assert spec is not None
    assert spec["input"] == "image" and manifest.io.image_shape == (1, 28, 28)
    assert [s["exit_layer"] for s in spec["segments"]] == [1, 2, 3]
    assert set(spec["curves"]) == set(EXIT_POLICIES)
    budget = spec["max_accuracy_loss"] + 1e-9
    assert spec["default"]["losses"] <= budget
    assert spec["default"]["accuracy"] >= spec["full_depth"]["accuracy"] - budget
    assert spec["default"] in spec["curves"][spec["policy"]]
    faster = [
        p
        for c in spec["curves"].values()
        for p in c
        if p["mean_layers"] < spec["default"]["mean_layers"]
    ]
    assert all(p["losses"] > budget for p in faster)  # the default is the fastest within budget


def test_segment_chain_matches_the_runner_and_rules(mnist_early_exit_package: Path) -> None:
    manifest = Manifest.read(mnist_early_exit_package)
    runner = SegmentRunner(
        mnist_early_exit_package, manifest, config=RuntimeConfig(threads=2, warmup_runs=0)
    )
    images = digit_split("test", limit=24).images
    trace = runner.trace(images, None)
    exit_index, logits = runner.run(images, None, threshold=NEVER_EXIT)
    assert exit_index.tolist() == [2] * len(images)
    np.testing.assert_array_equal(logits, trace.logits[-1])
    for policy, tau in [("max_softmax", 0.9), ("entropy", 0.2), ("patience", 2)]:
        expected = first_exit(trace.logits, tau, policy)
        for batch_policy in ("leave", "all"):
            got, answer = runner.run(
                images, None, threshold=tau, policy=batch_policy, exit_policy=policy
            )
            assert got.tolist() == expected.tolist()
            chosen = np.stack(trace.logits)[expected, np.arange(len(images))]
            np.testing.assert_allclose(answer, chosen, atol=1e-4)


def test_model_classifies_image_arrays(mnist_early_exit_package: Path) -> None:
    images = digit_split("test", limit=10).images  # [10, 1, 28, 28]
    with edgeinfer.load(mnist_early_exit_package, threads=2) as model:
        results = model.classify(images)
        assert len(results) == 10 and all(r.exit_layer in (1, 2, 3) for r in results)
        assert all(r.label == max(r.scores, key=r.scores.__getitem__) for r in results)
        same = model.classify(images[:, 0].astype(np.float64), batch_size=3)  # [N, 28, 28]
        assert [r.label for r in same] == [r.label for r in results]
        one = model.classify(images[0, 0])  # [28, 28]
        assert len(one) == 1 and one[0].label == results[0].label
        first = model.classify(images, exit_threshold=0.0)
        assert [r.exit_layer for r in first] == [1] * 10
        full = model.classify(images, exit_policy="patience", exit_threshold=4)
        assert [r.exit_layer for r in full] == [3] * 10
        assert sum(model.metrics().early_exits["classify"].values()) == 10 + 10 + 1 + 10 + 10
        for bad, match in [
            ((images * 255).astype(np.uint8), "floating point"),
            (images[:, :, :14], "shape"),
            (images * 2, r"\[0, 1\]"),
            (["a digit"], "numpy array"),
        ]:
            with pytest.raises(InputError, match=match):
                model.classify(bad)
    with pytest.raises(ConfigError, match="without cache"):
        edgeinfer.load(mnist_early_exit_package, cache=CacheConfig())


def test_curve_reproduces_at_runtime(mnist_early_exit_package: Path) -> None:
    spec = Manifest.read(mnist_early_exit_package).early_exit
    assert spec is not None
    validation = digit_split("validation", limit=spec["validation"]["limit"])
    assert len(validation.labels) == spec["validation"]["images"]
    with edgeinfer.load(mnist_early_exit_package, threads=2) as model:
        results = model.classify(validation.images, batch_size=16)
    accuracy = float(
        np.mean([int(r.label) == y for r, y in zip(results, validation.labels, strict=True)])
    )
    mean_layers = float(np.mean([r.exit_layer for r in results]))
    noise = 2 / len(validation.labels)  # batched float rounding may flip an image at the edge
    assert abs(accuracy - spec["default"]["accuracy"]) <= noise
    assert abs(mean_layers - spec["default"]["mean_layers"]) <= 2 * noise


def test_mnist_export_refuses_int8_and_other_data(tmp_path: Path) -> None:
    from edgeinfer.export.options import EarlyExitOptions, ExportOptions
    from edgeinfer.export.run import export

    out = tmp_path / "x"
    with pytest.raises(ConfigError, match="--quantize none"):
        export(ExportOptions(source="mnist-cnn", out=out, quantize="int8"))
    with pytest.raises(ConfigError, match="train-data mnist"):
        export(
            ExportOptions(
                source="mnist-cnn", out=out, builder=EarlyExitOptions(train_data="bbc-news")
            )
        )
    assert not out.exists()
