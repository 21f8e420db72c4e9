"""The source model in PyTorch eager fp32, with the same pre/post-processing as the runtime.

It is both the accuracy reference of the export gate and the baseline of ``edgeinfer bench``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export.source import Source, resolve_source
from edgeinfer.manifest import Manifest

__all__ = ["TorchReference"]

log = logging.getLogger(__name__)


class TorchReference:
    """A source model run as its users run it today: transformers + PyTorch eager, fp32.

    Args:
        source: the resolved source model.
        task: ``embed`` (mean pooling + L2 normalization) or ``classify`` (softmax).
        threads: torch intra-op threads (``None``: torch's default).
    """

    def __init__(self, source: Source, task: str, *, threads: int | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        self._torch = torch
        self._task = task
        self._max_len = source.max_seq_len
        self._tokenizer = AutoTokenizer.from_pretrained(str(source.path))  # type: ignore[no-untyped-call]
        auto = AutoModelForSequenceClassification if task == "classify" else AutoModel
        self._model = auto.from_pretrained(str(source.path)).eval()

    @classmethod
    def for_package(cls, package: Path, *, threads: int | None = None) -> TorchReference:
        """The reference of an exported package, found again from its manifest's ``source``."""
        manifest = Manifest.read(package)
        described = manifest.source
        spec = described["name"] if described.get("builtin") else described.get("path")
        if not spec:
            raise ConfigError(f"{package} does not record where its source model is")
        source = resolve_source(str(spec))
        if source.weights_sha256() != described.get("weights_sha256"):
            log.warning("the source weights differ from the ones %s was exported from", package)
        return cls(source, manifest.task, threads=threads)

    def run(self, texts: list[str]) -> np.ndarray:
        """Embeddings [N, D] (mean pooled, normalized) or probabilities [N, C], float32."""
        torch = self._torch
        with torch.inference_mode():
            batch = self._tokenizer(
                texts, padding=True, truncation=True, max_length=self._max_len, return_tensors="pt"
            )
            out = self._model(**batch)
            if self._task == "classify":
                result = torch.softmax(out.logits, dim=-1)
            else:
                mask = batch["attention_mask"].unsqueeze(-1).float()  # [B, S, 1]
                pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                result = torch.nn.functional.normalize(pooled, dim=-1)
            return np.asarray(result.numpy(), dtype=np.float32)
