"""Typed handles: one class per package kind, with only that kind's calls.

``load()`` returns a ``Model``, which answers every call and raises ``ConfigError`` at run time
for a call its kind does not serve. A handle makes that a type error instead: ::

    embedder = EmbedModel.load("pkg/my-embedder")   # PackageError if it is not an embed package
    vectors = embedder.embed(["pressure rising"])   # mypy knows there is no .generate here

Each handle wraps a loaded ``Model`` (``EmbedModel(model)`` checks its task) and forwards to it;
it adds no work on the hot path beyond one attribute look-up.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from edgeinfer.config import (
    BatchConfig,
    CacheConfig,
    ContinuousBatchConfig,
    PrefixCacheConfig,
    RuntimeConfig,
)
from edgeinfer.errors import PackageError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.early_exit import ExitPolicy
from edgeinfer.runtime.generate.chat import Prompt
from edgeinfer.runtime.generate.streaming import GenerateOptions, GenerationResult, TextChunk
from edgeinfer.runtime.metrics import MetricsSnapshot
from edgeinfer.runtime.model import DEFAULT_BATCH_SIZE, Model, load
from edgeinfer.runtime.tasks import ClassificationResult, Detection, EmbeddingResult

if TYPE_CHECKING:
    from typing_extensions import Unpack  # annotations only: no runtime dependency

__all__ = ["ClassifyModel", "DetectModel", "EmbedModel", "GenerateModel", "RawModel"]

H = TypeVar("H", bound="_Handle")
T = TypeVar("T", bound="_TextHandle")


class _Handle:
    """What every kind has: the package, its providers, metrics and ``close``."""

    TASK: ClassVar[str]

    def __init__(self, model: Model) -> None:
        if model.task != self.TASK:
            raise PackageError(
                f"{model.path} is a {model.task!r} package, not a {self.TASK!r} one: use "
                f"{_HANDLE_OF.get(model.task, 'edgeinfer.load')} for it"
            )
        self.model = model

    @classmethod
    def load(
        cls: type[H],
        package: str | Path,
        *,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        verify: bool = True,
        config: RuntimeConfig | None = None,
    ) -> H:
        """``edgeinfer.load`` for a package of this kind (``PackageError`` for another)."""
        return cls(
            load(package, providers=providers, threads=threads, verify=verify, config=config)
        )

    @property
    def path(self) -> Path:
        """The package folder."""
        return self.model.path

    @property
    def manifest(self) -> Manifest:
        """The package's manifest."""
        return self.model.manifest

    @property
    def task(self) -> str:
        """The package's task."""
        return self.model.task

    @property
    def providers(self) -> list[str]:
        """The onnxruntime providers the session really uses, in order."""
        return self.model.providers

    @property
    def cold_start_ms(self) -> float:
        """From ``load()`` being called to the model being warm."""
        return self.model.cold_start_ms

    def metrics(self) -> MetricsSnapshot:
        """Latency percentiles, cold start and cache counts (``Model.metrics``)."""
        return self.model.metrics()

    def close(self) -> None:
        """Release the model's threads and files."""
        self.model.close()

    def __enter__(self: H) -> H:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r})"


class _TextHandle(_Handle):
    """Text kinds: loaded with optional result caches and dynamic batching."""

    @classmethod
    def load(  # the text kinds take caches and batching too
        cls: type[T],
        package: str | Path,
        *,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        verify: bool = True,
        config: RuntimeConfig | None = None,
        cache: CacheConfig | None = None,
        batching: BatchConfig | None = None,
    ) -> T:
        """``edgeinfer.load`` for a package of this kind, with optional result caches and
        dynamic batching (docs/cache.md); ``PackageError`` for another task."""
        return cls(
            load(
                package,
                providers=providers,
                threads=threads,
                verify=verify,
                config=config,
                cache=cache,
                batching=batching,
            )
        )

    def clear_cache(self) -> None:
        """Empty the result caches."""
        self.model.clear_cache()


class EmbedModel(_TextHandle):
    """An ``embed`` package: sentence embeddings."""

    TASK = "embed"

    def embed(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
    ) -> np.ndarray:
        """float32 [N, D] unit vectors, row i for text i (``Model.embed``)."""
        return self.model.embed(texts, batch_size=batch_size, truncate=truncate)

    def embed_with_info(
        self,
        texts: str | Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
    ) -> list[EmbeddingResult]:
        """One ``EmbeddingResult`` per text (``Model.embed_with_info``)."""
        return self.model.embed_with_info(texts, batch_size=batch_size, truncate=truncate)


class ClassifyModel(_TextHandle):
    """A ``classify`` package: texts or images to labels (optionally with early exit)."""

    TASK = "classify"

    def classify(
        self,
        inputs: str | Path | Sequence[Any] | np.ndarray,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
        exit_threshold: float | None = None,
        exit_policy: ExitPolicy | None = None,
    ) -> list[ClassificationResult]:
        """One ``ClassificationResult`` per text or picture (``Model.classify``)."""
        return self.model.classify(
            inputs,
            batch_size=batch_size,
            truncate=truncate,
            exit_threshold=exit_threshold,
            exit_policy=exit_policy,
        )


class GenerateModel(_Handle):
    """A ``generate`` package: KV-cached text generation and streaming."""

    TASK = "generate"

    @classmethod
    def load(
        cls,
        package: str | Path,
        *,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        verify: bool = True,
        config: RuntimeConfig | None = None,
        prefix_cache: PrefixCacheConfig | None = None,
        continuous_batching: ContinuousBatchConfig | None = None,
    ) -> GenerateModel:
        """``edgeinfer.load`` for a generate package (``PackageError`` for another task)."""
        return cls(
            load(
                package,
                providers=providers,
                threads=threads,
                verify=verify,
                config=config,
                prefix_cache=prefix_cache,
                continuous_batching=continuous_batching,
            )
        )

    def generate(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> GenerationResult:
        """Complete ``prompt`` (``Model.generate``)."""
        return self.model.generate(prompt, **options)

    def stream(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> Iterator[TextChunk]:
        """Complete ``prompt``, yielding text as it is decoded (``Model.stream``)."""
        return self.model.stream(prompt, **options)

    def warm_prefix(self, prefix: str) -> int:
        """Keep the keys/values of text every prompt starts with (``Model.warm_prefix``)."""
        return self.model.warm_prefix(prefix)


class DetectModel(_Handle):
    """A ``detect`` package: object detections per image, NMS on the device."""

    TASK = "detect"

    def detect(self, images: Any, *, score_threshold: float | None = None) -> list[list[Detection]]:
        """Each image's detections, boxes in its own pixels (``Model.detect``)."""
        return self.model.detect(images, score_threshold=score_threshold)


class RawModel(_Handle):
    """A ``raw`` package: named arrays in and out, optionally stateful per stream."""

    TASK = "raw"

    def run(self, feeds: Mapping[str, Any], *, stream: str | None = None) -> dict[str, np.ndarray]:
        """Output name -> array for input name -> array (``Model.run``)."""
        return self.model.run(feeds, stream=stream)

    def end_stream(self, stream: str) -> None:
        """Forget ``stream``'s state."""
        self.model.end_stream(stream)


_HANDLE_OF = {
    "embed": "EmbedModel",
    "classify": "ClassifyModel",
    "generate": "GenerateModel",
    "detect": "DetectModel",
    "raw": "RawModel",
}
