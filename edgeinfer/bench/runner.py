"""Run a package and its baselines side by side: one process each, interleaved blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgeinfer.bench.stats import LatencySummary, summarize
from edgeinfer.errors import ConfigError, EdgeInferError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ImageClassifierIO, TextClassifierIO, TextEncoderIO

__all__ = [
    "BenchConfig",
    "BenchResult",
    "Candidate",
    "CandidateResult",
    "interleaved_rounds",
    "make_text",
    "run_bench",
]

# Plain English news prose; repeated as needed and cut to the requested token count.
_PARAGRAPH = (
    "The regional rail operator said on Tuesday that its new timetable would add two early "
    "trains on the northern line, after commuters complained that the first service of the "
    "day was often too crowded to board. Engineers will also replace the signalling system "
    "between the two busiest stations over the summer, which should cut delays by a third. "
    "Local businesses welcomed the plan but warned that the weekend closures needed for the "
    "work could hurt trade during the holiday season. "
)
# Idle intra-op threads spin for a moment after a run; a pause keeps one candidate's threads
# from stealing cycles from the next.
_SETTLE_S = 0.2


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: ``runs`` timed runs (after ``warmup``) of a batch of ``batch`` texts of
    ``seq_len`` tokens, split into ``rounds`` interleaved blocks per candidate."""

    runs: int = 200
    warmup: int = 20
    seq_len: int = 32
    batch: int = 1
    threads: int | None = None
    rounds: int = 5

    def __post_init__(self) -> None:
        for name in ("runs", "seq_len", "batch", "rounds"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")

    @property
    def thread_count(self) -> int:
        """Threads every candidate gets (default: every core)."""
        return self.threads or os.cpu_count() or 1


@dataclass(frozen=True)
class Candidate:
    """One thing to measure: a package, or the PyTorch eager run of a package's source."""

    label: str
    kind: Literal["package", "torch", "llamacpp"]
    path: Path


@dataclass
class CandidateResult:
    """What one candidate measured."""

    label: str
    kind: str
    latency: LatencySummary
    cold_start_ms: float
    peak_rss_bytes: int
    throughput_items_s: float
    latencies_ms: list[float] = field(repr=False, default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (without the raw latencies)."""
        return {
            "label": self.label,
            "kind": self.kind,
            "latency": self.latency.to_dict(),
            "cold_start_ms": round(self.cold_start_ms, 1),
            "peak_rss_mb": round(self.peak_rss_bytes / 2**20, 1),
            "throughput_items_s": round(self.throughput_items_s, 1),
        }


@dataclass
class BenchResult:
    """A whole run: the config, each candidate's numbers, and the subject's speedups."""

    config: BenchConfig
    seq_len: int
    results: list[CandidateResult]

    @property
    def speedups(self) -> dict[str, float]:
        """Baseline p50 / subject p50 for each baseline (> 1: the subject is faster)."""
        subject = self.results[0].latency.p50_ms
        return {r.label: r.latency.p50_ms / subject for r in self.results[1:]}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "config": {**self.config.__dict__, "threads": self.config.thread_count},
            "seq_len": self.seq_len,
            "results": [r.to_dict() for r in self.results],
            "speedup_p50": {k: round(v, 3) for k, v in self.speedups.items()},
        }


def make_text(package: Path, seq_len: int) -> tuple[str, int]:
    """English text that the package's tokenizer encodes to ``seq_len`` tokens (specials
    included), or as close as the tokenizer allows; returns (text, its token count)."""
    from tokenizers import Tokenizer

    io = Manifest.read(package).io
    if isinstance(io, ImageClassifierIO):  # no text: the worker makes the images
        return "", 0
    if not isinstance(io, (TextEncoderIO, TextClassifierIO)):
        raise ConfigError(f"{package} is a {io.kind!r} package; this benchmark takes texts")
    if seq_len > io.max_seq_len:
        raise ConfigError(
            f"seq_len {seq_len} exceeds the model's window of {io.max_seq_len} tokens"
        )
    tok = Tokenizer.from_file(str(package / io.tokenizer))
    specials = len(tok.encode("a").ids) - len(tok.encode("a", add_special_tokens=False).ids)
    words = _PARAGRAPH
    while len(tok.encode(words, add_special_tokens=False).ids) < seq_len:
        words += _PARAGRAPH
    ids = tok.encode(words, add_special_tokens=False).ids
    keep = max(1, seq_len - specials)
    text = tok.decode(ids[:keep])
    # Decoding can merge or split a token; trim until the text fits.
    while keep > 1 and len(tok.encode(text).ids) > seq_len:
        keep -= 1
        text = tok.decode(ids[:keep])
    return text, len(tok.encode(text).ids)


class _Worker:
    """A candidate's process (``python -m edgeinfer.bench.worker``, or ``module``; ``extra``
    joins the spec it is sent first)."""

    def __init__(
        self,
        candidate: Candidate,
        texts: list[str],
        threads: int,
        *,
        module: str = "edgeinfer.bench.worker",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.candidate = candidate
        self._proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        spec = {
            "kind": candidate.kind,
            "path": str(candidate.path),
            "threads": threads,
            "texts": texts,
            **(extra or {}),
        }
        self.loaded = self._ask(spec)  # the load report
        self.cold_start_ms = float(self.loaded["cold_start_ms"])

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None  # set by Popen
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise EdgeInferError(
                f"benchmark of {self.candidate.label} failed (worker exit code {code}); "
                "its error is printed above"
            )
        reply: dict[str, Any] = json.loads(line)
        return reply

    def measure(self, runs: int, warmup: int) -> dict[str, Any]:
        return self._ask({"cmd": "measure", "runs": runs, "warmup": warmup})

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None  # set by Popen
            self._proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self._proc.stdin.close()
            self._proc.wait(timeout=30)


def interleaved_rounds(
    candidates: list[Candidate],
    threads: int,
    *,
    module: str,
    extra: dict[str, Any],
    rounds: int,
) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each candidate in its own ``module`` process (``extra`` joins its spec), then ``rounds``
    rounds of one run each (the first after one warm-up), interleaved: (the load report, the
    replies) of each candidate."""
    workers: list[_Worker] = []
    replies: list[list[dict[str, Any]]] = [[] for _ in candidates]
    try:
        for candidate in candidates:  # started one at a time: cold starts do not compete
            workers.append(_Worker(candidate, [], threads, module=module, extra=extra))
        for round_index in range(rounds):
            for k, worker in enumerate(workers):
                replies[k].append(worker.measure(1, 1 if round_index == 0 else 0))
                time.sleep(_SETTLE_S)
    finally:
        for worker in workers:
            worker.close()
    return [(w.loaded, r) for w, r in zip(workers, replies, strict=True)]


def run_bench(subject: Candidate, baselines: list[Candidate], config: BenchConfig) -> BenchResult:
    """Measure ``subject`` and ``baselines`` in one run, interleaving their blocks."""
    text, seq_len = make_text(subject.path, config.seq_len)
    texts = [text] * config.batch
    candidates = [subject, *baselines]
    workers: list[_Worker] = []
    try:
        for candidate in candidates:  # started one at a time: cold starts do not compete
            workers.append(_Worker(candidate, texts, config.thread_count))
        samples: dict[str, list[float]] = {c.label: [] for c in candidates}
        rss: dict[str, int] = {}
        per_round = -(-config.runs // config.rounds)
        for round_index in range(config.rounds):
            warmup = config.warmup if round_index == 0 else min(config.warmup, 2)
            for worker in workers:
                reply = worker.measure(per_round, warmup)
                samples[worker.candidate.label].extend(reply["latencies_ms"])
                rss[worker.candidate.label] = int(reply["peak_rss_bytes"])
                time.sleep(_SETTLE_S)
    finally:
        for worker in workers:
            worker.close()
    results = []
    for worker in workers:
        label = worker.candidate.label
        latency = summarize(samples[label])
        results.append(
            CandidateResult(
                label=label,
                kind=worker.candidate.kind,
                latency=latency,
                cold_start_ms=worker.cold_start_ms,
                peak_rss_bytes=rss[label],
                throughput_items_s=config.batch * 1e3 / latency.mean_ms,
                latencies_ms=samples[label],
            )
        )
    return BenchResult(config=config, seq_len=seq_len, results=results)
