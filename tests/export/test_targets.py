"""The target presets: frozen, validated, and refused where they are not built yet."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgeinfer.config import TARGETS, QuantConfig
from edgeinfer.errors import ConfigError


def test_presets_are_frozen_and_named() -> None:
    for name, preset in TARGETS.items():
        config = preset()
        assert config.target == name
        assert config.providers[-1] == "cpu"  # every target falls back to the CPU
        with pytest.raises(dataclasses.FrozenInstanceError):
            config.mode = "none"  # type: ignore[misc]


def test_npu_and_gpu_presets() -> None:
    qnn = QuantConfig.npu_qnn()
    assert (qnn.mode, qnn.qdq_rules, qnn.fixed_batch) == ("int8-static", "qnn", 1)
    assert (qnn.activation_type, qnn.weight_type, qnn.per_channel) == ("uint16", "int8", True)
    openvino = QuantConfig.npu_openvino()
    assert (openvino.mode, openvino.qdq_rules, openvino.fixed_batch) == ("int8-static", "ort", 1)
    assert QuantConfig.gpu_cuda().mode == QuantConfig.gpu_tensorrt().mode == "fp16"
    assert QuantConfig.gpu_tensorrt().engine_cache_dir == "trt_engines"
    assert QuantConfig.gpu_cuda().engine_cache_dir is None
    with pytest.raises(ConfigError, match="fixed_batch"):
        dataclasses.replace(qnn, fixed_batch=0)
    with pytest.raises(ConfigError, match="unknown target"):
        QuantConfig.for_target("npu-imaginary")


def test_text_sources_refuse_npu_targets(tmp_path: Path) -> None:
    from edgeinfer.export.options import ExportOptions
    from edgeinfer.export.run import export

    options = ExportOptions(source="minilm", out=tmp_path / "out", target="npu-qnn")
    with pytest.raises(ConfigError, match="image classifiers"):
        export(options)
    assert not (tmp_path / "out").exists()
