"""Execution provider resolution: aliases, order, CPU fallback."""

from __future__ import annotations

import logging

import pytest

from edgeinfer import providers
from edgeinfer.errors import ConfigError, ProviderError


def test_aliases_map_to_ort_names() -> None:
    assert providers.to_ort_name("cuda") == "CUDAExecutionProvider"
    assert providers.to_ort_name("TensorrtExecutionProvider") == "TensorrtExecutionProvider"
    with pytest.raises(ConfigError, match="unknown execution provider"):
        providers.to_ort_name("warp-drive")


def test_order_is_kept_and_cpu_is_always_last() -> None:
    have = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert providers.resolve(["cuda", "tensorrt"], have=have) == [
        "CUDAExecutionProvider",
        "TensorrtExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert providers.resolve(["cpu", "cuda"], have=have) == [
        "CPUExecutionProvider",
        "CUDAExecutionProvider",
    ]


def test_missing_provider_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        chosen = providers.resolve(["qnn", "cuda"], have=["CPUExecutionProvider"])
    assert chosen == ["CPUExecutionProvider"]
    assert "QNNExecutionProvider is not available" in caplog.text


def test_no_cpu_at_all_is_an_error() -> None:
    with pytest.raises(ProviderError):
        providers.resolve(["cuda"], have=["AzureExecutionProvider"])


def test_this_device_has_cpu() -> None:
    assert "CPUExecutionProvider" in providers.available()
