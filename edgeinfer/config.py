"""Frozen, validated configuration objects; the named hardware presets (``QuantConfig``,
``TARGETS``) live in ``presets.py`` and are importable from here too.

Every non-obvious default carries a one-line reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

from edgeinfer.errors import ConfigError
from edgeinfer.presets import QUANT_MODES, TARGETS, CalibrationMethod, QuantConfig, QuantMode

__all__ = [
    "DEFAULT_RUN_TIMEOUT_S",
    "QUANT_MODES",
    "TARGETS",
    "BatchConfig",
    "CacheConfig",
    "CalibrationMethod",
    "ContinuousBatchConfig",
    "PrefixCacheConfig",
    "QuantConfig",
    "QuantMode",
    "RuntimeConfig",
    "SamplingConfig",
    "SemanticCacheConfig",
    "default_cache_dir",
]

# Far above one run of any package this SDK exports on a slow arm64 board (a long prefill takes
# seconds), short enough that a hung request frees its thread within a minute.
DEFAULT_RUN_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """How the runtime builds its onnxruntime sessions.

    Args:
        providers: execution provider aliases or ORT names in order of preference; ``None`` takes
            the package's preferred order. CPU is always the last resort.
        threads: intra-op threads; ``None`` uses every core, the fastest for one model at batch 1.
        spin_wait: let idle intra-op threads spin between ops. It saves ~4 % latency at batch 1
            for a process with one model, but several spinning sessions in one process fight
            for the cores (4-5x slower), so turn it off when serving more than one model.
        warmup_runs: runs at load so the first request does not pay allocation and kernel
            selection; 2 because the second run still allocates on some providers.
        verify: check every package file's sha256 before onnxruntime reads it (links and
            unlisted files are refused either way: ``Manifest.check_layout``).
        profile_dir: onnxruntime's profiler on: every session writes its per-op events into
            this folder when it is freed (``edgeinfer profile``; slows every run a little).
        file_backed_prepacks: on the CPU provider, keep the kernels' prepacked weights in a
            file made on this machine's first load (``runtime.prepacked``) instead of
            anonymous memory: under a memory limit they are evicted and re-read, so the process
            slows down where it would be killed. Off by default: the first load writes the
            graph again with its prepacks (about twice the package's weights on disk).
        prepack_cache_dir: where those files go; ``None``: ``default_cache_dir()/prepacked``.
        memory_budget_bytes: the memory a generate package may grow into: a request whose KV
            cache would not fit beside what the process already holds in anonymous memory is
            refused before it runs (``MemoryBudgetError``), and continuous batching admits
            within it. ``None``: the cgroup's memory limit when the process runs under one
            (systemd ``MemoryMax=``, a container's limit), else no budget.
        run_timeout_s: the longest one graph run may take; a run past it is stopped by
            onnxruntime and raises ``RunTimeoutError`` (``runtime.watchdog``), so an input that
            makes a graph loop for ever cannot hold its thread. ``DEFAULT_RUN_TIMEOUT_S``: 60
            s. ``None``: no limit but the caller's deadline.
    """

    providers: tuple[str, ...] | None = None
    threads: int | None = None
    spin_wait: bool = True
    warmup_runs: int = 2
    verify: bool = True
    profile_dir: Path | None = None
    file_backed_prepacks: bool = False
    prepack_cache_dir: Path | None = None
    memory_budget_bytes: int | None = None
    run_timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("profile_dir", "prepack_cache_dir"):  # a str is what users pass
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value).expanduser())
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise ConfigError(f"memory_budget_bytes must be >= 1, got {self.memory_budget_bytes}")
        if self.run_timeout_s is not None and not (
            isinstance(self.run_timeout_s, int | float)
            and not isinstance(self.run_timeout_s, bool)
            and 0 < self.run_timeout_s < 1e9
        ):
            raise ConfigError(
                f"run_timeout_s must be a number of seconds in (0, 1e9), or None; got "
                f"{self.run_timeout_s!r}"
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.warmup_runs < 0:
            raise ConfigError(f"warmup_runs must be >= 0, got {self.warmup_runs}")
        if self.providers is not None and not self.providers:
            raise ConfigError("providers must name at least one provider, or be None")

    @property
    def intra_op_threads(self) -> int:
        """The thread count to give onnxruntime (``threads`` or every core of this machine)."""
        return self.threads or os.cpu_count() or 1


def default_cache_dir() -> Path:
    """Where on-disk result caches live: ``$EDGEINFER_CACHE_DIR``, else ``~/.cache/edgeinfer``."""
    env = os.environ.get("EDGEINFER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgeinfer"


@dataclass(frozen=True, kw_only=True)
class SemanticCacheConfig:
    """The opt-in semantic cache: answer a text from the nearest cached text when cosine >= τ.

    Args:
        embedder: an ``embed`` package (MiniLM int8) used to embed every request's text.
        threshold: τ, the cosine similarity at or above which a cached answer is reused.
            No default on purpose: it depends on the labels and the traffic. Calibrate it with
            ``edgeinfer.runtime.cache.semantic.calibrate_threshold`` on labelled requests; on
            BBC News topics with MiniLM int8, a 1 % false-hit budget gives τ = 0.58
            (``benchmarks/semantic_cache_bbc.py``), a finer label set needs a higher τ.
        max_entries: texts kept (oldest replaced first); numpy brute force takes ~0.5 ms per
            lookup at 10k entries of 384 floats on two x86 cores and grows linearly beyond.
    """

    embedder: Path
    threshold: float
    max_entries: int = 10_000

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold is a cosine, in [-1, 1]; got {self.threshold}")
        if self.max_entries < 1:
            raise ConfigError(f"max_entries must be >= 1, got {self.max_entries}")


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """The result cache: an in-memory LRU in front of an optional SQLite file.

    Args:
        memory_bytes: capacity of the in-memory LRU (values and keys counted); 32 MiB holds
            ~20k MiniLM embeddings, small next to the model itself.
        persist: keep results in SQLite too, so that they survive restarts.
        directory: folder of the SQLite files, one per package digest; ``None`` takes
            ``default_cache_dir()``.
        disk_bytes: size bound of the SQLite store (values and keys); the oldest entries
            are evicted first.
        ttl_s: seconds a result stays valid in either tier; ``None`` keeps it until evicted.
            A week by default: results of a fixed package never go stale, the bound is for
            disk hygiene.
        semantic: the opt-in semantic cache (classification packages only).
    """

    memory_bytes: int = 32 * 2**20
    persist: bool = True
    directory: Path | None = None
    disk_bytes: int = 256 * 2**20
    ttl_s: float | None = 7 * 24 * 3600.0
    semantic: SemanticCacheConfig | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes < 0:
            raise ConfigError(f"memory_bytes must be >= 0, got {self.memory_bytes}")
        if self.disk_bytes < 1:
            raise ConfigError(f"disk_bytes must be >= 1, got {self.disk_bytes}")
        if self.ttl_s is not None and self.ttl_s <= 0:
            raise ConfigError(f"ttl_s must be > 0 or None, got {self.ttl_s}")

    def db_path(self, digest: str) -> Path:
        """The SQLite file that holds the results of the package with ``digest``."""
        return (self.directory or default_cache_dir()) / f"results-{digest[:32]}.sqlite3"


@dataclass(frozen=True, kw_only=True)
class PrefixCacheConfig:
    """The on-disk prefix KV cache of a ``generate`` package: a system prompt's keys and values
    survive a restart, so the first request after it prefills only the new tokens.

    Args:
        directory: folder of the prefix files; ``None`` takes ``default_cache_dir() / "prefix-kv"``.
        max_bytes: size bound of the folder; the least recently used prefixes are evicted.
            256 MiB holds ~25 SmolLM2-135M system prompts of 200 tokens (9.2 MB each).
    """

    directory: Path | None = None
    max_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError(f"max_bytes must be >= 1, got {self.max_bytes}")

    @property
    def folder(self) -> Path:
        """The folder the prefix files go to."""
        return self.directory or default_cache_dir() / "prefix-kv"


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """Dynamic micro-batching of concurrent ``embed``/``classify`` calls.

    Args:
        max_batch_size: texts per graph run at most; 8 fills two to four CPU cores with
            MiniLM-sized models while a batch stays a few milliseconds long.
        max_wait_ms: how long the first queued text may wait for company; 2 ms is below one
            batch-1 MiniLM run, so a lone request pays little for the chance of a batch.
        bucket_tokens: texts are grouped by length in buckets this many tokens wide (padding
            waste stays under one bucket per text).
        adaptive_wait: skip ``max_wait_ms`` while only one caller is active (the last batch
            and the queue held one call's texts): a lone request pays no wait for company
            that is not coming; the first batch with two callers turns waiting back on.
        workers: batches run at once, each on its own thread (onnxruntime sessions take
            concurrent runs); 1 by default. With ``RuntimeConfig(threads=1)`` and one worker
            per core, each core runs its own batch instead of splitting small GEMMs.
    """

    max_batch_size: int = 8
    max_wait_ms: float = 2.0
    bucket_tokens: int = 32
    adaptive_wait: bool = True
    workers: int = 1

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.bucket_tokens < 1:
            raise ConfigError(f"bucket_tokens must be >= 1, got {self.bucket_tokens}")
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")


@dataclass(frozen=True, kw_only=True)
class ContinuousBatchConfig:
    """Several generations of one ``generate`` package decoded together: one graph run per
    step advances every active sequence (``runtime/generate/engine.py``).

    Args:
        max_sequences: sequences decoded at once; ``None``: two per core, at most 8 (on two
            cores four streams give 2-2.5x one stream's tokens/s, eight add less and double
            each stream's inter-token time). More requests wait their turn.
        kv_budget_bytes: the KV cache all admitted sequences may need together (each needs
            prompt + max_new_tokens positions); a sequence waits until it fits. ``None``: no
            budget beyond ``max_sequences``.
        prefill_chunk_tokens: the bounded step: a newcomer's prompt runs at most this many
            tokens between two decode steps of the others (chunks end at its multiples). 32:
            with 4 streams and ~240-token prompts their inter-token p99 is a quarter of a
            whole-prompt step's, with the TTFT of 64; 8 or 16 gain no tail and double the TTFT
            (benchmarks/step_budget.py).
        lone_prefill_tokens: with none decoding (none waits between two tokens) a prompt runs
            in runs of up to this many tokens (ending at its multiples): attention's transient
            memory grows with a run's tokens times the context, so a long prompt's peak stays
            bounded. 256: a 2000-token prompt on SmolLM2-135M int8 peaks 108 MiB above its load
            (88 MiB of it keys/values) against 166 MiB in one run, in the same prefill time;
            128 saves 1 MiB more (benchmarks/lone_prefill.py).
    """

    max_sequences: int | None = None
    kv_budget_bytes: int | None = None
    prefill_chunk_tokens: int = 32
    lone_prefill_tokens: int = 256

    def __post_init__(self) -> None:
        if self.max_sequences is not None and not 1 <= self.max_sequences <= 256:
            raise ConfigError(f"max_sequences must be in [1, 256], got {self.max_sequences}")
        if self.kv_budget_bytes is not None and self.kv_budget_bytes < 1:
            raise ConfigError(f"kv_budget_bytes must be >= 1, got {self.kv_budget_bytes}")
        if self.prefill_chunk_tokens < 1:
            raise ConfigError(f"prefill_chunk_tokens must be >= 1, got {self.prefill_chunk_tokens}")
        if self.lone_prefill_tokens < 1:
            raise ConfigError(f"lone_prefill_tokens must be >= 1, got {self.lone_prefill_tokens}")

    @property
    def sequences(self) -> int:
        """``max_sequences``, or two per core (at most 8) when it is ``None``."""
        if self.max_sequences is not None:
            return self.max_sequences
        return max(1, min(8, 2 * (os.cpu_count() or 1)))


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the next token is chosen during generation.

    Args:
        temperature: 0 is greedy (argmax, deterministic); above 0 the logits are divided by it
            and a token is drawn from the softmax.
        top_k: draw only among the k most likely tokens; 0 turns the filter off.
        top_p: draw only among the most likely tokens whose probabilities sum to at least p
            (nucleus sampling); 1.0 turns the filter off.
        seed: seed of the random generator, for reproducible sampling; ``None`` draws a fresh
            seed per request.
        draft_tokens: greedy decoding of a request alone on a load without continuous
            batching drafts up to this many tokens per step by prompt lookup (the continuation
            of an earlier occurrence of the last words) and verifies them in one pass: faster
            when the answer quotes its input. Its steps then run attention on two rows (the
            bits of a verification, so drafts never change its tokens), whose float sums differ
            from a plain step's: at near-ties its greedy answer may differ from the one the
            request gets with 0, the same however the package is loaded.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    draft_tokens: int = 0  # off: one greedy answer whatever the load (8 is a good value)

    # Below this the logits divided by the temperature overflow float32 for some vocabularies
    # (1 / 1e-38 is inf: NaN probabilities, garbage tokens), and long before that the draw is
    # argmax anyway: 0 asks for greedy.
    MIN_TEMPERATURE: ClassVar[float] = 1e-3
    MAX_TEMPERATURE: ClassVar[float] = 100.0

    def __post_init__(self) -> None:
        t, lo, hi = self.temperature, self.MIN_TEMPERATURE, self.MAX_TEMPERATURE
        if not _is_number(t, float) or not (t == 0.0 or lo <= t <= hi):
            raise ConfigError(f"temperature must be 0 (greedy) or in [{lo:g}, {hi:g}], got {t!r}")
        if not _is_number(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_number(self.top_p, float) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_number(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not _is_number(self.draft_tokens, int) or not 0 <= self.draft_tokens <= 64:
            raise ConfigError(
                f"draft_tokens must be an integer in [0, 64], got {self.draft_tokens!r}"
            )

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0.0

    @classmethod
    def creative(cls, *, seed: int | None = None) -> SamplingConfig:
        """Temperature 0.7, top-p 0.9: the common chat setting (varied, rarely incoherent)."""
        return cls(temperature=0.7, top_p=0.9, seed=seed)


def _is_number(value: object, kind: type) -> bool:
    """An int (``kind`` int) or an int or float (``kind`` float); never a bool."""
    allowed = (int,) if kind is int else (int, float)
    return isinstance(value, allowed) and not isinstance(value, bool)
