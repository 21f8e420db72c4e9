"""A generation engine under a memory limit: a Linux cgroup (v2 ``memory.max``, or v1
``memory.limit_in_bytes``) holding one engine's process, as a board with that much memory would.

``run_limited`` runs one engine (a generate package, or a GGUF file on llama.cpp) in a fresh
cgroup for one greedy request and says whether the kernel killed it for memory (the cgroup's own
``oom_kill`` count, not a guess from the exit code). ``smallest_limit`` bisects, in steps of 10
MiB below the engine's unconstrained peak, for the smallest limit at which it still decodes at
``min_fraction`` of its unconstrained speed.

Page cache is charged to the cgroup that reads a page first, so the engine's files are dropped
from the cache before each run (``POSIX_FADV_DONTNEED``): a weight file cached by an earlier run
outside the cgroup would otherwise be free inside it. Creating cgroups needs root (or a
delegated hierarchy); ``cgroup_unavailable`` says why not when it cannot.

``python -m edgeinfer.bench.memory_limit PKG [--gguf FILE] [--file-backed DIR] [--tokens 64]
[--json]`` runs the sweep for the package, the package with file-backed prepacks
(``RuntimeConfig.file_backed_prepacks``, kept in DIR) and the GGUF side by side. Bench layer:
stdlib, and the generation worker (``edgeinfer.bench.generation_worker``) in the limited
process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, EdgeInferError

__all__ = [
    "LimitedRun",
    "SweepResult",
    "cgroup_unavailable",
    "run_limited",
    "smallest_limit",
    "smallest_passing",
]

_ROOT = Path("/sys/fs/cgroup")
STEP_BYTES = 10 * 2**20  # the steps: a board's memory is known to about this
MIN_FRACTION = 0.9  # "still serving": at least 90 % of the unconstrained decode rate
FREE_RUNS = 3  # unconstrained runs whose median rate is the reference
RUNS = 3  # requests per process, the median rate kept: one run is at the mercy of a neighbour


@dataclass(frozen=True)
class LimitedRun:
    """One engine's request under ``limit_bytes`` (``None``: no limit).

    Attributes:
        oom_killed: the kernel killed the process for the cgroup's memory.
        returncode: the process's exit status (negative: the signal that ended it).
        decode_tokens_per_s: the median run's decode rate; ``None`` when it did not finish.
        ttft_ms: the median run's time to the first token; ``None`` when it did not finish.
        peak_rss_bytes: the process's VmHWM at the end of the run (0 when it did not finish).
        token_ids: the median run's greedy tokens (empty when it did not finish).
        error: the last line the process wrote to stderr when it failed, else "".
    """

    limit_bytes: int | None
    oom_killed: bool
    returncode: int
    decode_tokens_per_s: float | None
    ttft_ms: float | None
    peak_rss_bytes: int
    token_ids: tuple[int, ...]
    error: str


@dataclass(frozen=True)
class SweepResult:
    """The smallest limit (a multiple of ``step_bytes``) at which an engine still decodes at
    ``min_fraction`` of its unconstrained rate; ``smallest_bytes`` is None when even the first
    limit tried was too small. ``runs`` holds every run, the unconstrained ones first (their
    median rate is ``unconstrained_tokens_per_s``)."""

    engine: str
    smallest_bytes: int | None
    unconstrained_tokens_per_s: float
    runs: tuple[LimitedRun, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def _version() -> int | None:
    if (_ROOT / "cgroup.controllers").is_file():
        return 2
    if (_ROOT / "memory" / "memory.limit_in_bytes").is_file():
        return 1
    return None


def cgroup_unavailable() -> str | None:
    """Why this process cannot create memory cgroups here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "memory cgroups are Linux's"
    version = _version()
    if version is None:
        return f"no cgroup memory controller is mounted under {_ROOT}"
    parent = _ROOT / "memory" if version == 1 else _ROOT
    if version == 2 and "memory" not in (_ROOT / "cgroup.subtree_control").read_text().split():
        return "cgroup v2 without the memory controller enabled for child groups"
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable (run as root, or delegate a cgroup)"
    return None


class _Cgroup:
    """A fresh memory cgroup with a limit; removed on ``close`` (its process gone)."""

    def __init__(self, limit_bytes: int) -> None:
        reason = cgroup_unavailable()
        if reason is not None:
            raise ConfigError(f"cannot limit memory here: {reason}")
        self.version = _version()
        parent = _ROOT / "memory" if self.version == 1 else _ROOT
        self.path = parent / f"edgeinfer-limit-{os.getpid()}-{limit_bytes}"
        self.path.mkdir()
        limit_file = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        (self.path / limit_file).write_text(str(limit_bytes))
        if self.version == 2:
            (self.path / "memory.swap.max").write_text("0")  # a board without swap

    def enter(self) -> None:
        """Move the calling process into the group (the child, before it runs anything)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        """How many processes the kernel killed for this group's memory."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0  # kernels before 4.13 do not count: an OOM kill then shows as SIGKILL only

    def close(self) -> None:
        self.path.rmdir()


def _drop_cache(path: Path) -> None:
    """Evict ``path``'s clean pages (every file under it) from the page cache."""
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_limited(
    kind: str,
    path: Path,
    prompt_ids: Sequence[int],
    *,
    limit_bytes: int | None,
    tokens: int = 64,
    threads: int = 2,
    timeout_s: float = 300.0,
    prepack_cache_dir: Path | None = None,
) -> LimitedRun:
    """Load ``path`` (``kind`` "package" or "llamacpp") in a process under ``limit_bytes``
    and decode ``tokens`` greedy tokens after ``prompt_ids``, ``RUNS`` times (the median
    run is reported). ``prepack_cache_dir``: a package with file-backed prepacks kept there
    (``RuntimeConfig.file_backed_prepacks``; built by the first run that finds none).

    Raises:
        ConfigError: no memory cgroup can be made here (``cgroup_unavailable`` says why).
    """
    group = _Cgroup(limit_bytes) if limit_bytes is not None else None
    spec: dict[str, Any] = {"kind": kind, "path": str(path), "prompt_ids": list(prompt_ids)}
    if prepack_cache_dir is not None:
        spec["prepack_cache_dir"] = str(prepack_cache_dir)
        if prepack_cache_dir.is_dir():
            _drop_cache(prepack_cache_dir)
    commands = [{**spec, "tokens": tokens, "threads": threads, "warmup": 0}]
    commands += [{"cmd": "measure", "warmup": 0, "runs": RUNS}, {"cmd": "quit"}]
    _drop_cache(path)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "edgeinfer.bench.generation_worker"],
            input="".join(json.dumps(c) + "\n" for c in commands),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            preexec_fn=group.enter if group is not None else None,
        )
        returncode, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:  # too slow to count as serving (the child is killed)
        returncode, out, err = -9, "", f"no answer in {timeout_s:.0f} s"
    finally:
        killed = group.oom_kills() > 0 if group is not None else False
        if group is not None:
            group.close()
    replies = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    runs = replies[1]["runs"] if returncode == 0 and len(replies) == 2 else []
    run = (
        sorted(runs, key=lambda r: float(r["decode_tokens_per_s"]))[len(runs) // 2]
        if runs
        else None
    )
    return LimitedRun(
        limit_bytes=limit_bytes,
        oom_killed=killed,
        returncode=returncode,
        decode_tokens_per_s=None if run is None else float(run["decode_tokens_per_s"]),
        ttft_ms=None if run is None else float(run["ttft_ms"]),
        peak_rss_bytes=int(replies[1]["peak_rss_bytes"]) if run is not None else 0,
        token_ids=() if run is None else tuple(int(t) for t in run["token_ids"]),
        error="" if run is not None else (err.strip().splitlines() or ["no output"])[-1],
    )


def smallest_passing(serves: Callable[[int], bool], top: int) -> int | None:
    """The smallest ``n`` in 1..``top`` for which ``serves(n)``, by bisection, given that
    ``serves`` holds from some ``n`` upwards; None when ``serves(top)`` does not hold (nothing
    smaller is tried then)."""
    if not serves(top):
        return None
    failing, passing = 0, top
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if serves(middle):
            passing = middle
        else:
            failing = middle
    return passing


def smallest_limit(
    kind: str,
    path: Path,
    prompt_ids: Sequence[int],
    *,
    tokens: int = 64,
    threads: int = 2,
    step_bytes: int = STEP_BYTES,
    min_fraction: float = MIN_FRACTION,
    prepack_cache_dir: Path | None = None,
) -> SweepResult:
    """The smallest multiple of ``step_bytes`` at which the engine still decodes at
    ``min_fraction`` of its unconstrained rate, found by bisection between 0 and the engine's
    unconstrained peak (rounded up to a step): ~7 runs where stepping down from a 750 MiB peak
    takes 35. It assumes a lower limit never decodes faster, which holds for evictable pages
    (a lower limit only evicts more). The unconstrained run builds the file-backed prepacks
    in ``prepack_cache_dir`` if there are none yet."""

    timeout_s = 300.0

    def run(limit_bytes: int | None) -> LimitedRun:
        return run_limited(
            kind,
            path,
            prompt_ids,
            limit_bytes=limit_bytes,
            tokens=tokens,
            threads=threads,
            timeout_s=timeout_s,
            prepack_cache_dir=prepack_cache_dir,
        )

    started = time.monotonic()
    # The reference is the median of three unconstrained runs: one fast outlier (a quiet
    # second on a shared machine) would fail every limit below it.
    free_runs = [run(None) for _ in range(FREE_RUNS)]
    rates = sorted(r.decode_tokens_per_s for r in free_runs if r.decode_tokens_per_s is not None)
    if len(rates) < FREE_RUNS:
        failed = next(r for r in free_runs if r.decode_tokens_per_s is None)
        raise EdgeInferError(f"{path} did not decode without a limit: {failed.error}")
    unconstrained = rates[FREE_RUNS // 2]
    # A run that takes 4x as long as a free one (plus a load's slack) is not at 90 % speed:
    # stopped there instead of thrashing for minutes at a limit far below the working set.
    timeout_s = 4 * (time.monotonic() - started) / FREE_RUNS + 30
    runs = list(free_runs)

    def serves(steps: int) -> bool:
        runs.append(run(steps * step_bytes))
        rate = runs[-1].decode_tokens_per_s
        return rate is not None and rate >= min_fraction * unconstrained

    top = -(-max(r.peak_rss_bytes for r in free_runs) // step_bytes)  # the peak, in steps
    passing = smallest_passing(serves, top)
    smallest = None if passing is None else passing * step_bytes
    engine = f"{path} (file-backed prepacks)" if prepack_cache_dir is not None else str(path)
    return SweepResult(engine, smallest, unconstrained, tuple(runs))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m edgeinfer.bench.memory_limit PKG [--gguf FILE] [--file-backed DIR]
    [--tokens N] [--json]``."""
    parser = argparse.ArgumentParser(prog="python -m edgeinfer.bench.memory_limit")
    parser.add_argument("package", type=Path, help="generate package folder")
    parser.add_argument("--gguf", type=Path, default=None, help="llama.cpp beside it")
    parser.add_argument(
        "--file-backed",
        type=Path,
        default=None,
        metavar="DIR",
        help="the package again with file-backed prepacks kept in DIR",
    )
    parser.add_argument("--tokens", type=int, default=64, help="greedy decode steps")
    parser.add_argument("--threads", type=int, default=2, help="threads per engine")
    parser.add_argument("--json", action="store_true", help="print as JSON")
    args = parser.parse_args(argv)
    from edgeinfer.bench.generation import prompt_ids

    try:
        ids = prompt_ids(args.package)
        engines: list[tuple[str, Path, Path | None]] = [("package", args.package, None)]
        if args.file_backed is not None:
            engines.append(("package", args.package, args.file_backed))
        if args.gguf is not None:
            engines.append(("llamacpp", args.gguf, None))
        found = [
            smallest_limit(
                kind, path, ids, tokens=args.tokens, threads=args.threads, prepack_cache_dir=cache
            )
            for kind, path, cache in engines
        ]
    except EdgeInferError as exc:
        sys.stderr.write(f"error ({exc.code}): {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps([f.to_dict() for f in found], indent=2) + "\n")
        return 0
    for f in found:
        smallest = (
            "none tried" if f.smallest_bytes is None else f"{f.smallest_bytes / 2**20:.0f} MiB"
        )
        sys.stdout.write(
            f"{f.engine}: smallest limit at >= {MIN_FRACTION:.0%} of "
            f"{f.unconstrained_tokens_per_s:.1f} tok/s: {smallest}; "
            + ", ".join(
                f"{r.limit_bytes / 2**20:.0f} MiB "
                + ("OOM-killed" if r.oom_killed else f"{r.decode_tokens_per_s or 0:.1f} tok/s")
                for r in f.runs
                if r.limit_bytes is not None
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
