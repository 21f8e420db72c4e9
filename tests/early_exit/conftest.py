"""A small real early-exit package: MiniLM, exits at layers 2, 4 and 6, heads trained on a few
dozen BBC News articles (seconds), fp32 segments. Built once per session through the real export
pipeline (or reused from EDGEINFER_TEST_CACHE, re-verified against its manifest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.errors import EdgeInferError
from edgeinfer.manifest import Manifest

# Articles per split: enough for every topic and a meaningful curve, small enough for seconds.
ARTICLES = 60


@pytest.fixture(scope="session")
def early_exit_package(package_root: Path) -> Path:
    """An fp32 early-exit classify package (exit every 2 layers, BBC topics)."""
    from edgeinfer.export.pipeline import ExportOptions, export

    out = package_root / "minilm-early-exit"
    if out.exists():
        try:
            Manifest.read(out).verify(out)
            return out
        except EdgeInferError:
            pass
    export(
        ExportOptions(
            source="minilm",
            out=out,
            task="classify",
            quantize="none",
            early_exit=True,
            exit_every=2,
            train_data="bbc",
            early_exit_articles=ARTICLES,
            max_accuracy_loss=0.01,
            overwrite=True,
            threads=2,
        )
    )
    return out


def _runtime_conftest() -> object:
    """tests/runtime/conftest.py, whose fixture builds a plain (no exit) classify package;
    loaded by path because the tests folder is not a package."""
    import importlib.util

    path = Path(__file__).parent.parent / "runtime" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_edgeinfer_runtime_conftest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


minilm_classifier = _runtime_conftest().minilm_classifier  # type: ignore[attr-defined]
