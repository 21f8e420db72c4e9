"""``Model``, what every package kind shares, and ``load()``: package -> verified files -> the
class of its kind -> warm -> answers.

Each kind is a subclass in ``kinds/`` (``EmbedModel``, ``ClassifyModel``, ``DetectModel``,
``RawModel``, ``GenerateModel``) that names the manifest ``io.kind`` values it serves
(``IO_KINDS``) and declares its own calls; ``load()`` picks the class from ``io.kind`` alone.
``Model`` owns the manifest, the providers, the metrics, the load timings and ``close``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from edgeinfer import providers as eps
from edgeinfer.config import (
    BatchConfig,
    CacheConfig,
    ContinuousBatchConfig,
    PrefixCacheConfig,
    RuntimeConfig,
)
from edgeinfer.errors import ConfigError, PackageError, UnsupportedCallError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.metrics import Metrics, MetricsSnapshot
from edgeinfer.runtime.session import GraphSession

__all__ = ["DEFAULT_BATCH_SIZE", "Model", "load", "narrow"]

log = logging.getLogger(__name__)

# Texts or images per graph run: big enough to fill the cores, small enough to bound
# activation memory.
DEFAULT_BATCH_SIZE = 32

M = TypeVar("M", bound="Model")


class Model:
    """A loaded, warmed model package: what every kind has. ``edgeinfer.load`` returns the
    class of the package's kind (``EmbedModel``, ``ClassifyModel``, ``DetectModel``,
    ``RawModel``, ``GenerateModel``), so ``isinstance`` tells mypy which calls it has; a call
    of another kind raises ``UnsupportedCallError`` (a ``ConfigError`` and an
    ``AttributeError``) naming the class that has it.

    Calls are thread-safe.

    Attributes:
        path: the package folder.
        manifest: its parsed manifest.
        config: the runtime settings it was loaded with.
        providers: the ORT providers the session really uses, in order.
        cold_start_ms: from ``load()`` being called to the model being warm.
        load_breakdown_ms: the same time split into ``verify``, ``session`` and ``warmup``.
    """

    TASK: ClassVar[str] = ""  # the manifest task a kind serves
    IO_KINDS: ClassVar[tuple[str, ...]] = ()  # the manifest io.kind values a kind serves
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # the optional load() features a kind takes

    providers: list[str]

    def __init__(self, path: Path, manifest: Manifest, *, config: RuntimeConfig) -> None:
        self.path = path
        self.manifest = manifest
        self.config = config
        self._metrics = Metrics(model=manifest.name)
        self.cold_start_ms = 0.0
        self.load_breakdown_ms: dict[str, float] = {}

    @classmethod
    def load(
        cls: type[M],
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
    ) -> M:
        """Load a model package, verify it, start its session and warm it up.

        ``edgeinfer.load`` (``Model.load``) returns the class of the package's kind; a kind's
        own ``load`` (``EmbedModel.load``, ...) returns that class or raises ``PackageError``
        naming the class for the package.

        Args:
            package: the package folder written by ``edgeinfer export``.
            providers: execution providers in order of preference (aliases like ``cuda`` or
                ORT names); default: the package's own order. CPU is always the fallback.
            threads: intra-op threads (default: every core).
            verify: check each file's sha256 against the manifest before loading
                (recommended); even without it, a package holding a symbolic link or a file
                its manifest does not list is refused.
            config: a full ``RuntimeConfig``; the keyword arguments above override its fields.
            cache: cache results (memory LRU, SQLite, optional semantic cache) of embed and
                text classify packages; ``None``: off.
            batching: gather concurrent calls of embed and text classify packages into
                dynamic batches; ``None``: each call runs alone.
            prefix_cache: keep a generate package's system-prompt keys/values on disk across
                restarts (see ``docs/generation.md``); ``None``: in memory only.
            continuous_batching: decode several of a generate package's requests together
                (calls from several threads share each graph run); ``None``: one at a time.

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
        kind = _kind(cls, path, manifest)
        features: dict[str, Any] = {
            "cache": cache,
            "batching": batching,
            "prefix_cache": prefix_cache,
            "continuous_batching": continuous_batching,
        }
        _refuse_features(kind, manifest, [name for name, v in features.items() if v is not None])
        verified = time.perf_counter()
        if config.verify:
            manifest.verify(path)
        else:  # no hashing, but never a link or an unlisted file: a graph could read either
            manifest.check_layout(path)
        opened = time.perf_counter()
        model = kind(path, manifest, config=config, **{n: features[n] for n in kind.OPTIONS})
        session_done = time.perf_counter()
        model._warm_up(config.warmup_runs)
        ready = time.perf_counter()
        model.load_breakdown_ms = {
            "verify": (opened - verified) * 1e3,
            "session": (session_done - opened) * 1e3,
            "warmup": (ready - session_done) * 1e3,
        }
        model.cold_start_ms = (ready - started) * 1e3
        model._metrics.mark_ready(model.cold_start_ms)
        log.info("loaded %s in %.1f ms (%s)", path, model.cold_start_ms, ", ".join(model.providers))
        return model

    @property
    def task(self) -> str:
        """The package's task: ``embed``, ``classify``, ``detect``, ``generate`` or ``raw``."""
        return self.manifest.task

    def metrics(self) -> MetricsSnapshot:
        """A snapshot of this model's latencies (p50/p95/p99), cold start and cache counts.
        ``edgeinfer.render_prometheus([model])`` writes it for Prometheus."""
        return self._metrics.snapshot()

    def close(self) -> None:
        """Stop the model's threads and close its files; later calls may fail (kinds without
        either: nothing to do)."""

    def _warm_up(self, runs: int) -> None:
        """Run ``runs`` throw-away requests so the first real one pays no allocation."""

    def _open_graph(self, graph: str) -> GraphSession:
        """A session of the package's ``graph`` on the requested providers (default: the
        package's own order)."""
        requested = eps.resolve(self.config.providers or tuple(self.manifest.providers))
        return GraphSession(self.path / graph, providers=requested, config=self.config)

    def __enter__(self: M) -> M:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.manifest.name!r}, kind={self.manifest.io.kind!r}, "
            f"precision={self.manifest.precision!r}, providers={self.providers})"
        )

    if not TYPE_CHECKING:  # for mypy a kind has its own calls only

        def __getattr__(self, name: str) -> Any:
            """Another kind's call: an error that says which class has it."""
            owners = _owners_of(name)
            if not owners:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raise UnsupportedCallError(
                f"{self.path.name} is a {self.manifest.io.kind!r} package (task "
                f"{self.task!r}, {type(self).__name__}); it has no {name}(): "
                + " and ".join(f"{k.__name__} ({k.TASK} packages)" for k in owners)
                + (" have it" if len(owners) > 1 else " has it")
            )


load = Model.load


def narrow(model: Model, kind: type[M]) -> M:
    """``model`` as ``kind`` (for code that takes any ``Model``); ``PackageError`` when it is
    a package of another kind."""
    if not isinstance(model, kind):
        raise PackageError(
            f"{model.path.name} is a {model.task!r} package, not a {kind.TASK!r} one"
        )
    return model


def _kinds(base: type[M]) -> Iterator[type[M]]:
    """``base`` and every class below it, parents first."""
    yield base
    for sub in base.__subclasses__():
        yield from _kinds(sub)


def _owners_of(call: str) -> list[type[Model]]:
    """The kinds that declare ``call`` (a public member ``Model`` does not have)."""
    if call.startswith("_") or hasattr(Model, call):
        return []
    return [kind for kind in _kinds(Model) if call in vars(kind)]


def _kind(cls: type[M], path: Path, manifest: Manifest) -> type[M]:
    """The class under ``cls`` that serves the package's ``io.kind``; ``PackageError`` naming
    the class that does when it is another one."""
    io_kind = manifest.io.kind
    kind: type[M] | None = next((k for k in _kinds(cls) if io_kind in k.IO_KINDS), None)
    if kind is not None:
        return kind
    owner: type[Model] | None = next((k for k in _kinds(Model) if io_kind in k.IO_KINDS), None)
    if owner is None:
        raise PackageError(f"{path}: no class of this edgeinfer serves {io_kind!r} packages")
    raise PackageError(
        f"{path} is a {manifest.task!r} package ({io_kind!r}); {cls.__name__}.load loads "
        f"{cls.TASK} packages: load it with {owner.__name__}.load or edgeinfer.load"
    )


def _refuse_features(kind: type[Model], manifest: Manifest, given: list[str]) -> None:
    """``ConfigError`` for a load() feature the package's kind does not take."""
    for name in given:
        if name not in kind.OPTIONS:
            takers = [k.TASK for k in _kinds(Model) if name in k.OPTIONS]
            raise ConfigError(
                f"{name} serves {' and '.join(takers)} packages; load this {manifest.task!r} "
                f"package ({manifest.io.kind!r}) without it"
            )
