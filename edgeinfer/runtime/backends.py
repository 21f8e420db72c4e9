"""What ``Model`` forwards to: one backend per package kind.

A backend serves the calls its kind supports and inherits, for every other call, an error that
names the package's kind. The ``Model`` facade picks the backend from ``io.kind``
(``model.py``), times its start and warm-up, and owns the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.config import (
    BatchConfig,
    CacheConfig,
    ContinuousBatchConfig,
    PrefixCacheConfig,
    RuntimeConfig,
)
from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.early_exit import ExitPolicy
from edgeinfer.runtime.generate.chat import Prompt
from edgeinfer.runtime.generate.generator import Generator
from edgeinfer.runtime.generate.streaming import GenerateOptions, GenerationResult, TextChunk
from edgeinfer.runtime.metrics import Metrics
from edgeinfer.runtime.tasks import ClassificationResult, Detection, EmbeddingResult

if TYPE_CHECKING:
    from typing_extensions import Unpack  # annotations only: no runtime dependency

__all__ = ["Backend", "BackendOptions", "GenerateBackend"]


@dataclass(frozen=True)
class BackendOptions:
    """What ``load()`` asked for, as every backend receives it.

    Attributes:
        config: providers, threads, spinning, warm-up runs.
        metrics: where latencies, cache hits and exits are counted.
        cache, batching, prefix_cache, continuous_batching: the optional features (a backend
            refuses those its kind cannot serve).
        load: loads another package with the same settings (the semantic cache's embedder).
    """

    config: RuntimeConfig
    metrics: Metrics
    cache: CacheConfig | None = None
    batching: BatchConfig | None = None
    prefix_cache: PrefixCacheConfig | None = None
    continuous_batching: ContinuousBatchConfig | None = None
    load: Callable[[Path], Any] | None = None


class Backend:
    """The calls of one package kind, built from ``(path, manifest, options)``."""

    providers: list[str]
    max_sequences = 1  # generations decoded at once (continuous batching: more)

    def __init__(self, path: Path, manifest: Manifest, options: BackendOptions) -> None:
        self.path, self.manifest, self.metrics = path, manifest, options.metrics
        if options.continuous_batching is not None and manifest.io.kind != "decoder":
            raise ConfigError(
                "continuous batching decodes generate packages; load this "
                f"{manifest.task!r} package without it (embed/classify batch with BatchConfig)"
            )

    def _unsupported(self, call: str) -> ConfigError:
        return ConfigError(
            f"{self.path.name} is a {self.manifest.io.kind!r} package "
            f"(task {self.manifest.task!r}); it has no {call}()"
        )

    def warm_up(self, runs: int) -> None:
        """Run ``runs`` throw-away requests so the first real one pays no allocation."""

    def embed_with_info(
        self, texts: str | Sequence[str], *, batch_size: int, truncate: bool
    ) -> list[EmbeddingResult]:
        """Embeddings with their cache flag and timings."""
        raise self._unsupported("embed")

    def classify(
        self,
        inputs: Any,
        *,
        batch_size: int,
        truncate: bool,
        exit_threshold: float | None,
        exit_policy: ExitPolicy | None,
    ) -> list[ClassificationResult]:
        """One result per text or image."""
        raise self._unsupported("classify")

    def detect(self, images: Any, *, score_threshold: float | None) -> list[list[Detection]]:
        """Each image's detections (detector packages)."""
        raise self._unsupported("detect")

    def generate(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> GenerationResult:
        """A completion of ``prompt``."""
        raise self._unsupported("generate")

    def stream(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> Iterator[TextChunk]:
        """A completion of ``prompt``, as it is decoded."""
        raise self._unsupported("stream")

    def warm_prefix(self, prefix: str) -> int:
        """Keep the keys/values of a prefix every prompt starts with."""
        raise self._unsupported("warm_prefix")

    def run(self, feeds: Any, *, stream: str | None = None) -> dict[str, Any]:
        """Named outputs of the graph for named inputs (raw packages)."""
        raise self._unsupported("run")

    def end_stream(self, stream: str) -> None:
        """Forget a stream's state (raw packages)."""
        raise self._unsupported("end_stream")

    def clear_cache(self) -> None:
        """Empty the result caches (kinds without one: nothing to do)."""

    def generation_stats(self) -> dict[str, Any] | None:
        """The continuous-batching engine's figures; ``None`` for kinds without one."""
        return None

    def close(self) -> None:
        """Release threads and files (kinds without any: nothing to do)."""


class GenerateBackend(Backend):
    """A ``decoder`` package: KV-cached generation (``generate.Generator``)."""

    def __init__(self, path: Path, manifest: Manifest, options: BackendOptions) -> None:
        super().__init__(path, manifest, options)
        if options.cache is not None or options.batching is not None:
            raise ConfigError(
                "result caching and dynamic batching serve embed/classify packages; load a "
                "generate package without them"
            )
        self.generator = Generator(
            path,
            manifest,
            config=options.config,
            prefix_cache=options.prefix_cache,
            batching=options.continuous_batching,
        )
        self.providers = self.generator.providers
        engine = self.generator.engine
        self.max_sequences = 1 if engine is None else engine.max_sequences

    def generation_stats(self) -> dict[str, Any] | None:
        engine = self.generator.engine
        return None if engine is None else engine.stats()

    def warm_up(self, runs: int) -> None:
        self.generator.warm_up(runs)

    def generate(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> GenerationResult:
        return self.generator.generate(prompt, **options)

    def stream(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> Iterator[TextChunk]:
        return self.generator.stream(prompt, **options)

    def warm_prefix(self, prefix: str) -> int:
        return self.generator.warm_prefix(prefix)

    def close(self) -> None:
        self.generator.close()
