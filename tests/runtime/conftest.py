"""A real classification package for the cache tests: MiniLM with a sequence-classification head.

The head is freshly initialised (seeded), so its labels are arbitrary but deterministic: enough
to test that a cached answer equals the fresh one. Exported once per session (or reused from
EDGEINFER_TEST_CACHE) through the real pipeline, fp32, no accuracy gate worth the name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgeinfer.errors import EdgeInferError
from edgeinfer.manifest import Manifest

TOPICS = ["business", "entertainment", "politics", "sport", "tech"]


@pytest.fixture(scope="session")
def minilm_classifier(package_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real fp32 classify package (5 BBC topics, untrained head) built from MiniLM."""
    out = package_root / "minilm-classify"
    if out.exists():
        try:
            Manifest.read(out).verify(out)
            return out
        except EdgeInferError:
            pass
    import torch
    from transformers import BertForSequenceClassification

    from edgeinfer.export.pipeline import ExportOptions, export
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
    export(
        ExportOptions(
            source=str(folder),
            out=out,
            task="classify",
            quantize="none",
            held_count=16,
            max_accuracy_loss=0.5,
            overwrite=True,
        )
    )
    return out
