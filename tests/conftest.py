"""Shared fixtures: real packages exported once per test session from the real MiniLM model.

Set EDGEINFER_TEST_CACHE to a folder to reuse the exported packages across runs while developing
(each is re-verified against its manifest before reuse); CI leaves it unset and exports fresh.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeInferError
from edgeinfer.manifest import Manifest


def _exported(root: Path, name: str, **options: object) -> Path:
    from edgeinfer.export.pipeline import ExportOptions, export

    out = root / name
    if out.exists():
        try:
            Manifest.read(out).verify(out)
            return out
        except EdgeInferError:
            pass
    export(ExportOptions(source="minilm", out=out, overwrite=True, **options))  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="session")
def package_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("EDGEINFER_TEST_CACHE")
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        return Path(cache)
    return tmp_path_factory.mktemp("packages")


@pytest.fixture(scope="session")
def minilm_int8(package_root: Path) -> Path:
    """A real MiniLM int8 package (dynamic, per-channel), exported through the full pipeline."""
    # force_quantize: the int8-vs-fp32 speed guard times both on this (shared, noisy) machine;
    # fixtures must not depend on timing. The guard is tested with a variant that is
    # slower by a wide margin (static QDQ on the fused graph) in test_export.py.
    return _exported(
        package_root, "minilm-int8", quantize="int8", held_count=48, force_quantize=True
    )


@pytest.fixture(scope="session")
def minilm_fp32(package_root: Path) -> Path:
    """A real MiniLM fp32 package (fused graph, no quantization)."""
    return _exported(package_root, "minilm-fp32", quantize="none", held_count=48)
