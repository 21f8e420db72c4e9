"""``EmbedModel``: a ``text-encoder`` package's sentence embeddings, with optional result
caches and dynamic batching (docs/cache.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgeinfer.config import BatchConfig, CacheConfig, RuntimeConfig
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.kinds.text import TextRunner
from edgeinfer.runtime.model import DEFAULT_BATCH_SIZE, Model
from edgeinfer.runtime.tasks import EmbeddingResult

__all__ = ["EmbedModel"]


class EmbedModel(Model):
    """An ``embed`` package: texts to unit vectors. ``EmbedModel.load`` loads one (a
    ``PackageError`` for another kind); ``edgeinfer.load`` returns one for such a package."""

    TASK = "embed"
    IO_KINDS = ("text-encoder",)
    OPTIONS = ("cache", "batching")

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        cache: CacheConfig | None = None,
        batching: BatchConfig | None = None,
    ) -> None:
        super().__init__(path, manifest, config=config)
        if cache is not None and cache.semantic is not None:
            raise ConfigError(
                f"the semantic cache answers classification packages; {path.name} is 'embed' "
                "(a neighbour's embedding is not this text's embedding)"
            )
        self._texts = TextRunner(
            path, manifest, config=config, metrics=self._metrics, cache=cache, batching=batching
        )
        self.providers = self._texts.providers

    def embed(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
    ) -> np.ndarray:
        """Embed texts: pooling over tokens, then L2 normalization (as the source does).

        Args:
            texts: one text or a sequence of texts.
            batch_size: texts per graph run (with dynamic batching: its ``max_batch_size``).
            truncate: cut texts longer than the model's window; if False they raise ``InputError``.

        Returns:
            float32 array [N, D], row i for text i. ``embed_with_info`` also says which rows
            came from the cache and how long each waited and ran.
        """
        answers = self.embed_with_info(texts, batch_size=batch_size, truncate=truncate)
        return np.stack([a.vector for a in answers]).astype(np.float32, copy=False)

    def embed_with_info(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
    ) -> list[EmbeddingResult]:
        """As ``embed``, one ``EmbeddingResult`` per text: its vector (read-only), whether it
        came from the cache, and its queue and compute time."""
        answers = self._texts.answer(texts, batch_size=batch_size, truncate=truncate)
        return [EmbeddingResult(a.value, a.cached, a.queue_ms, a.compute_ms) for a in answers]

    def clear_cache(self) -> None:
        """Empty the result caches (memory, the SQLite file)."""
        self._texts.clear_cache()

    def close(self) -> None:
        """Stop the batching thread and close the cache file; later calls may fail."""
        self._texts.close()

    def _warm_up(self, runs: int) -> None:
        self._texts.warm_up(runs)
