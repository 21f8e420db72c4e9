"""The runtime on real packages: embeddings, batching, inputs, integrity, providers."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError, InputError, IntegrityError, PackageError

TEXTS = [
    "The central bank left interest rates unchanged.",
    "A short one.",
    "The striker scored twice in the second half to win the cup final for his club.",
]


@pytest.fixture(scope="module")
def model(minilm_int8: Path) -> edgeinfer.Model:
    return edgeinfer.load(minilm_int8)


def test_embed_returns_unit_vectors_in_input_order(model: edgeinfer.Model) -> None:
    vectors = model.embed(TEXTS)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    one_by_one = np.stack([model.embed(t)[0] for t in TEXTS])
    # Dynamic int8 picks activation scales per run, so padding a batch moves results slightly.
    assert np.sum(vectors * one_by_one, axis=1).min() > 0.98
    np.testing.assert_array_equal(model.embed(TEXTS, batch_size=1), one_by_one)


def test_batched_fp32_equals_one_by_one(minilm_fp32: Path) -> None:
    model = edgeinfer.load(minilm_fp32)
    one_by_one = np.stack([model.embed(t)[0] for t in TEXTS])
    np.testing.assert_allclose(model.embed(TEXTS), one_by_one, atol=1e-5)


def test_similar_texts_are_closer_than_unrelated_ones(model: edgeinfer.Model) -> None:
    a, b, c = model.embed(
        [
            "The bank raised interest rates.",
            "Interest rates were increased by the central bank.",
            "The goalkeeper saved a penalty.",
        ]
    )
    assert a @ b > a @ c + 0.3


def test_int8_keeps_fp32_answers(minilm_int8: Path, minilm_fp32: Path) -> None:
    int8 = edgeinfer.load(minilm_int8).embed(TEXTS)
    fp32 = edgeinfer.load(minilm_fp32).embed(TEXTS)
    cosines = np.sum(int8 * fp32, axis=1)
    gate = edgeinfer.Manifest.read(minilm_int8).accuracy
    assert cosines.min() >= 1 - 3 * gate["max_accuracy_loss"]


def test_bad_inputs_get_clear_errors(model: edgeinfer.Model) -> None:
    with pytest.raises(InputError):
        model.embed([])
    with pytest.raises(InputError):
        model.embed(["fine", ""])
    with pytest.raises(InputError):
        model.embed([b"bytes"])  # type: ignore[list-item]
    long_text = "word " * 600
    assert model.embed(long_text).shape == (1, 384)  # truncated like the source model
    with pytest.raises(InputError, match="256 tokens"):
        model.embed(long_text, truncate=False)
    with pytest.raises(ConfigError, match="no classify"):
        model.classify("an embedding package cannot classify")
    assert model.embed("still serving after errors").shape == (1, 384)


def test_load_reports_cold_start_and_providers(model: edgeinfer.Model) -> None:
    assert model.cold_start_ms > 0
    assert set(model.load_breakdown_ms) == {"verify", "session", "warmup"}
    assert model.providers[-1] == "CPUExecutionProvider"
    assert "int8" in repr(model)


def test_unavailable_provider_falls_back_to_cpu(
    minilm_int8: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        model = edgeinfer.load(minilm_int8, providers=["tensorrt", "cuda"], threads=1)
    assert model.providers == ["CPUExecutionProvider"]
    assert "not available" in caplog.text


def test_tampered_graph_is_refused_before_onnxruntime_reads_it(
    minilm_int8: Path, tmp_path: Path
) -> None:
    pkg = tmp_path / "pkg"
    shutil.copytree(minilm_int8, pkg)
    graph = pkg / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[:64] = b"\xff" * 64  # onnxruntime itself would fail with a protobuf parse error
    graph.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model\.onnx"):
        edgeinfer.load(pkg)
    with pytest.raises(PackageError, match=r"could not load model\.onnx"):
        edgeinfer.load(pkg, verify=False)


def test_runtime_config_is_validated() -> None:
    with pytest.raises(ConfigError):
        RuntimeConfig(threads=0)
    with pytest.raises(ConfigError):
        RuntimeConfig(providers=())
    with pytest.raises(ConfigError):
        RuntimeConfig(warmup_runs=-1)


def test_runtime_config_takes_folders_as_strings(tmp_path: Path) -> None:
    config = RuntimeConfig(prepack_cache_dir=str(tmp_path), profile_dir=str(tmp_path / "p"))  # type: ignore[arg-type]
    assert config.prepack_cache_dir == tmp_path
    assert config.profile_dir == tmp_path / "p"


def test_generate_on_an_encoder_package_is_refused(model: edgeinfer.Model) -> None:
    with pytest.raises(ConfigError, match="no generate"):
        model.generate("hello")
    with pytest.raises(ConfigError, match="no stream"):
        model.stream("hello")
