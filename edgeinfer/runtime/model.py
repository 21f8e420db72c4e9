"""``load()`` and the ``Model`` facade: package -> verified files -> the backend of its kind ->
warm -> answers.

The backend is chosen from the manifest's ``io.kind`` alone (``BACKENDS``); ``Model`` forwards
every call to it and owns what all kinds share: the load timings and the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.config import (
    BatchConfig,
    CacheConfig,
    ContinuousBatchConfig,
    PrefixCacheConfig,
    RuntimeConfig,
)
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO
from edgeinfer.runtime.backends import Backend, BackendOptions, GenerateBackend
from edgeinfer.runtime.detect import DetectBackend
from edgeinfer.runtime.early_exit import ExitPolicy
from edgeinfer.runtime.generate.chat import Prompt
from edgeinfer.runtime.generate.streaming import GenerateOptions, GenerationResult, TextChunk
from edgeinfer.runtime.image import ImageBackend
from edgeinfer.runtime.metrics import Metrics, MetricsSnapshot
from edgeinfer.runtime.raw import RawBackend
from edgeinfer.runtime.tasks import ClassificationResult, Detection, EmbeddingResult
from edgeinfer.runtime.text import TextBackend

if TYPE_CHECKING:
    from typing_extensions import Unpack  # annotations only: no runtime dependency

__all__ = ["BACKENDS", "Model", "load"]

log = logging.getLogger(__name__)

# Texts per graph run: big enough to fill the cores, small enough to bound activation memory.
DEFAULT_BATCH_SIZE = 32


def _segments_backend(path: Path, manifest: Manifest, options: BackendOptions) -> Backend:
    """Exit segments take texts or images, as their io says."""
    io = manifest.io_as(ExitSegmentsIO)
    backend = TextBackend if io.input == "text" else ImageBackend
    return backend(path, manifest, options)


# io.kind -> the backend that serves it.
BACKENDS: dict[str, Callable[[Path, Manifest, BackendOptions], Backend]] = {
    "text-encoder": TextBackend,
    "text-classifier": TextBackend,
    "exit-segments": _segments_backend,
    "image-classifier": ImageBackend,
    "image-detector": DetectBackend,
    "decoder": GenerateBackend,
    "raw": RawBackend,
}


class Model:
    """A loaded, warmed model package. Create it with ``edgeinfer.load``.

    Calls are thread-safe. With a ``BatchConfig``, concurrent calls are gathered into dynamic
    batches; with a ``CacheConfig``, answers are cached (see ``docs/cache.md``). A call the
    package's kind does not serve raises ``ConfigError`` naming the kind.

    Attributes:
        path: the package folder.
        manifest: its parsed manifest.
        config: the runtime settings it was loaded with.
        providers: the ORT providers the session really uses, in order.
        cold_start_ms: from ``load()`` being called to the model being warm.
        load_breakdown_ms: the same time split into ``verify``, ``session`` and ``warmup``.
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        config: RuntimeConfig,
        cache: CacheConfig | None = None,
        batching: BatchConfig | None = None,
        prefix_cache: PrefixCacheConfig | None = None,
        continuous_batching: ContinuousBatchConfig | None = None,
        load_started_s: float | None = None,
        verify_ms: float = 0.0,
    ) -> None:
        started = time.perf_counter()
        self.path = path
        self.manifest = manifest
        self.config = config
        self._metrics = Metrics(model=manifest.name)
        options = BackendOptions(
            config=config,
            metrics=self._metrics,
            cache=cache,
            batching=batching,
            prefix_cache=prefix_cache,
            continuous_batching=continuous_batching,
            load=lambda package: load(package, config=config),
        )
        self._backend = BACKENDS[manifest.io.kind](path, manifest, options)
        self.providers: list[str] = self._backend.providers
        session_done = time.perf_counter()
        self._backend.warm_up(config.warmup_runs)
        ready = time.perf_counter()
        self.load_breakdown_ms = {
            "verify": verify_ms,
            "session": (session_done - started) * 1e3,
            "warmup": (ready - session_done) * 1e3,
        }
        self.cold_start_ms = (ready - (load_started_s or started)) * 1e3
        self._metrics.mark_ready(self.cold_start_ms)

    @property
    def task(self) -> str:
        """The package's task: ``embed``, ``classify``, ``generate`` or ``raw``."""
        return self.manifest.task

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
        answers = self._backend.embed_with_info(texts, batch_size=batch_size, truncate=truncate)
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
        return self._backend.embed_with_info(texts, batch_size=batch_size, truncate=truncate)

    def classify(
        self,
        inputs: str | Path | Sequence[Any] | np.ndarray,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        truncate: bool = True,
        exit_threshold: float | None = None,
        exit_policy: ExitPolicy | None = None,
    ) -> list[ClassificationResult]:
        """Classify texts or images; one ``ClassificationResult`` per input, in input order
        (its ``cached``, ``queue_ms`` and ``compute_ms`` say where the answer came from).

        Image packages take pictures as callers hold them: a file path, a Pillow image, a uint8
        RGB array [H, W, 3] of any size, a list of those, or a uint8 batch [N, H, W, 3]; each
        is resized and cropped as the manifest's ``io.image`` says (Pillow, the ``images``
        extra, is needed unless the arrays already have the package's size). The normalized
        float32 [N, 3, H, W] the graph takes passes as it is. An image early-exit package
        takes float32 intensities in [0, 1], [N, 1, H, W] or [N, H, W].

        On an early-exit package an input is answered by the first exit head where
        ``exit_policy`` (``max_softmax``, ``entropy`` or ``patience``; default: the one chosen
        at export) passes ``exit_threshold`` (default: the calibrated one) and ``exit_layer``
        names that head's layer (see docs/early_exit.md).
        """
        return self._backend.classify(
            inputs,
            batch_size=batch_size,
            truncate=truncate,
            exit_threshold=exit_threshold,
            exit_policy=exit_policy,
        )

    def generate(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> GenerationResult:
        """Complete ``prompt`` (text, or chat messages rendered with the package's template).
        ``options``: ``max_new_tokens`` (128), ``sampling`` (greedy), ``stop`` strings and
        ``timeout_s`` (see ``Generator.generate``).

        Stops at the end-of-text token, a ``stop`` string, ``max_new_tokens`` or ``timeout_s``.
        Raises ``ContextLengthExceededError`` before any work when the prompt plus
        ``max_new_tokens`` exceeds the package's context length.
        """
        return self._backend.generate(prompt, **options)

    def stream(self, prompt: Prompt, **options: Unpack[GenerateOptions]) -> Iterator[TextChunk]:
        """As ``generate``, yielding text as it is decoded (never half a character)."""
        return self._backend.stream(prompt, **options)

    def warm_prefix(self, prefix: str) -> int:
        """Load (or prefill and store) the keys/values of text every prompt starts with;
        returns its token count. A chat's system message needs no call: it is kept
        automatically. See ``docs/generation.md``."""
        return self._backend.warm_prefix(prefix)

    def detect(self, images: Any, *, score_threshold: float | None = None) -> list[list[Detection]]:
        """A detector package's detections per image (paths, Pillow images, uint8 RGB
        arrays), best first, boxes x1, y1, x2, y2 in each image's own pixels; NMS as the
        manifest says (``score_threshold`` overrides its threshold). See docs/onnx.md."""
        return self._backend.detect(images, score_threshold=score_threshold)

    def run(self, feeds: Mapping[str, Any], *, stream: str | None = None) -> dict[str, np.ndarray]:
        """Run a ``raw`` package's graph: input name -> array in, output name -> array out.

        With ``stream`` (any name: a microphone, a device), a stateful graph's state inputs
        come from that stream's previous call (zeros on its first) and its state outputs are
        kept for the next one instead of being returned; without it, every call stands alone.
        See docs/onnx.md.
        """
        return self._backend.run(feeds, stream=stream)

    def end_stream(self, stream: str) -> None:
        """Forget ``stream``'s state: its next ``run`` starts afresh."""
        self._backend.end_stream(stream)

    @property
    def max_sequences(self) -> int:
        """Generations this model decodes at once: ``continuous_batching``'s slots, else 1."""
        return self._backend.max_sequences

    def generation_stats(self) -> dict[str, Any] | None:
        """Continuous batching now: active and waiting sequences, tokens/s over the last
        10 s, inter-token p50/p99 and queue-wait p50 (ms), KV bytes; ``None`` without it."""
        return self._backend.generation_stats()

    def metrics(self) -> MetricsSnapshot:
        """A snapshot of this model's latencies (p50/p95/p99), cold start and cache counts.
        ``edgeinfer.render_prometheus([model.metrics()])`` writes it for Prometheus."""
        return self._metrics.snapshot()

    def clear_cache(self) -> None:
        """Empty this model's result caches (memory, its SQLite file, the semantic cache)."""
        self._backend.clear_cache()

    def close(self) -> None:
        """Stop the batching threads and close the cache file; later calls may fail."""
        self._backend.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Model({self.manifest.name!r}, kind={self.manifest.io.kind!r}, "
            f"precision={self.manifest.precision!r}, providers={self.providers})"
        )


def load(
    package: str | Path,
    *,
    providers: Sequence[str] | None = None,
    threads: int | None = None,
    verify: bool = True,
    config: RuntimeConfig | None = None,
    cache: CacheConfig | None = None,
    batching: BatchConfig | None = None,
    prefix_cache: PrefixCacheConfig | None = None,
    continuous_batching: ContinuousBatchConfig | None = None,
) -> Model:
    """Load a model package, verify it, start its session and warm it up.

    Args:
        package: the package folder written by ``edgeinfer export``.
        providers: execution providers in order of preference (aliases like ``cuda`` or ORT
            names); default: the package's own order. CPU is always the fallback.
        threads: intra-op threads (default: every core).
        verify: check each file's sha256 against the manifest before loading (recommended);
            even without it, a package holding a symbolic link or a file its manifest does
            not list is refused.
        config: a full ``RuntimeConfig``; the keyword arguments above override its fields.
        cache: cache results (memory LRU, SQLite, optional semantic cache); ``None``: off.
        batching: gather concurrent calls into dynamic batches; ``None``: each call runs alone.
        prefix_cache: keep a generate package's system-prompt keys/values on disk across
            restarts (see ``docs/generation.md``); ``None``: in memory only.
        continuous_batching: decode several of a generate package's requests together (calls
            from several threads share each graph run); ``None``: one at a time.

    Raises:
        ManifestError, IntegrityError, PackageError, ProviderError, ConfigError.
    """
    started = time.perf_counter()
    path = Path(package)
    base = config or RuntimeConfig()
    config = replace(
        base,
        providers=tuple(providers) if providers is not None else base.providers,
        threads=threads if threads is not None else base.threads,
        verify=verify and base.verify,
    )
    manifest = Manifest.read(path)
    verified = time.perf_counter()
    if config.verify:
        manifest.verify(path)
    else:  # no hashing, but never a link or an unlisted file: a graph could read either
        manifest.check_layout(path)
    model = Model(
        path,
        manifest,
        config=config,
        cache=cache,
        batching=batching,
        prefix_cache=prefix_cache,
        continuous_batching=continuous_batching,
        load_started_s=started,
        verify_ms=(time.perf_counter() - verified) * 1e3,
    )
    log.info("loaded %s in %.1f ms (%s)", path, model.cold_start_ms, ", ".join(model.providers))
    return model
