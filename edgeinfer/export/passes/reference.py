"""The source model in PyTorch eager fp32, with the same pre/post-processing as the runtime.

It is both the accuracy reference of the export gate and the baseline of ``edgeinfer bench``.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export.source import Source, resolve_source
from edgeinfer.manifest import Manifest

__all__ = ["TorchReference", "hf_generate_speed"]

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
        # A tokenizer may emit inputs its model does not take (DistilBERT: token_type_ids).
        self._takes = set(inspect.signature(self._model.forward).parameters)

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
            out = self._model(**{k: v for k, v in batch.items() if k in self._takes})
            if self._task == "classify":
                result = torch.softmax(out.logits, dim=-1)
            else:
                mask = batch["attention_mask"].unsqueeze(-1).float()  # [B, S, 1]
                pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                result = torch.nn.functional.normalize(pooled, dim=-1)
            return np.asarray(result.numpy(), dtype=np.float32)


def hf_generate_speed(
    source: str, prompt: list[dict[str, str]], *, threads: int, tokens: int
) -> dict[str, Any]:
    """The generation baseline of ``edgeinfer bench``: Hugging Face ``generate`` (greedy, KV
    cache on) on a decoder source in fp32 — time to first token and decode tokens/s."""
    import tempfile

    import torch
    from tokenizers import Tokenizer

    from edgeinfer.export.decoder.lm import load_decoder, prepare_decoder_tokenizer
    from edgeinfer.runtime.generate.chat import render_chat

    torch.set_num_threads(threads)
    src = resolve_source(source)
    model = load_decoder(src)
    with tempfile.TemporaryDirectory() as tmp:
        info = prepare_decoder_tokenizer(src, Path(tmp) / "tokenizer.json")
        tok = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    if info.chat_format is None:
        raise ConfigError(
            f"{source} has no chat template, and the generation baseline sends a chat prompt; "
            "benchmark a chat (instruct) model"
        )
    text = render_chat(info.chat_format, prompt)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])

    def run(n: int) -> float:
        with torch.inference_mode():
            return _seconds(
                lambda: model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                    pad_token_id=info.tokens["pad"],
                )
            )

    run(4)
    first = min(run(1) for _ in range(2))
    total = run(tokens + 1)
    return {
        "baseline": f"transformers {source} fp32",
        "ttft_ms": round(first * 1e3, 1),
        "decode_tokens_per_s": round(tokens / (total - first), 1),
    }


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
