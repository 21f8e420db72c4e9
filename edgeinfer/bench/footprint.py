"""What the runtime costs on a device: the resident memory (RSS) of a process serving a package,
beside the installed size of the distributions it loaded (``installed.py``).

``python -m edgeinfer.bench.footprint PKG`` measures a fresh process that imports the runtime, loads
PKG and answers one request, so the numbers hold no CLI, no test runner and no other model;
``edgeinfer inspect PKG --footprint`` runs it. Runtime layer: stdlib plus ``edgeinfer.runtime``
(numpy, onnxruntime, tokenizers), imported only when a package is measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeinfer.bench.installed import DistributionSize, distribution_sizes, loaded_distributions
from edgeinfer.errors import ConfigError, EdgeInferError, InferenceError

__all__ = [
    "Breakdown",
    "MemoryUsage",
    "ServingFootprint",
    "breakdown_of",
    "measure_serving",
    "measure_serving_in_subprocess",
    "memory_usage",
]

# One short request of each kind: enough to touch every graph and buffer once.
SAMPLE_TEXTS = ("The bank raised rates.", "A river runs through the old town.")
SAMPLE_PROMPT = "The capital of France is"
SAMPLE_NEW_TOKENS = 16


@dataclass(frozen=True)
class MemoryUsage:
    """A process's resident memory now (``rss_bytes``) and at its highest (``peak_rss_bytes``);
    of ``rss_bytes``, ``anonymous_bytes`` are the process's own pages (heap, copies: the kernel
    can only swap them out) and ``file_bytes`` pages of mapped files (clean ones it can drop
    and read again). Both 0 where the system does not say."""

    rss_bytes: int
    peak_rss_bytes: int
    anonymous_bytes: int = 0
    file_bytes: int = 0


@dataclass(frozen=True)
class Breakdown:
    """Where a serving process's resident memory goes, in bytes; the parts sum to its RSS.

    Attributes:
        runtime_and_python: the interpreter and the runtime's libraries, imported.
        tokenizer: what the package's tokenizer holds once loaded (measured alone, before
            the model).
        file_weights: resident pages of the package's own files (mapped weights: the kernel
            drops and rereads them under memory pressure).
        anonymous_weights: the rest of the process's own memory that loading and one request
            added: prepacked weight copies, onnxruntime's arena, the heap.
        kv_cache: the keys and values of the request's tokens (generate packages).
        other_files: library pages first touched by loading and running (code, data).
        kv_bytes_per_token: what each token of context adds (generate packages; 0 otherwise).
    """

    runtime_and_python: int
    tokenizer: int
    file_weights: int
    anonymous_weights: int
    kv_cache: int
    other_files: int
    kv_bytes_per_token: int


@dataclass(frozen=True)
class ServingFootprint:
    """The footprint of one process serving one package.

    Attributes:
        package: the package folder.
        task: the package's task (embed, classify, generate).
        machine: ``platform.machine()`` of the process (x86_64, aarch64, ...).
        libraries: memory after importing the runtime, before loading the package.
        serving: memory after loading the package and answering one request.
        distributions: the non-stdlib distributions the process imported, with their sizes.
        breakdown: ``serving.rss_bytes`` by what holds it.
    """

    package: str
    task: str
    machine: str
    libraries: MemoryUsage
    serving: MemoryUsage
    distributions: tuple[DistributionSize, ...]
    breakdown: Breakdown

    @property
    def installed_bytes(self) -> int:
        """The installed size of every distribution the serving process imported."""
        return sum(d.bytes for d in self.distributions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        out = asdict(self)
        out["installed_bytes"] = self.installed_bytes
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingFootprint:
        """The inverse of ``to_dict``."""
        return cls(
            package=data["package"],
            task=data["task"],
            machine=data["machine"],
            libraries=MemoryUsage(**data["libraries"]),
            serving=MemoryUsage(**data["serving"]),
            distributions=tuple(DistributionSize(**d) for d in data["distributions"]),
            breakdown=Breakdown(**data["breakdown"]),
        )


def memory_usage() -> MemoryUsage:
    """This process's resident memory: ``VmRSS``/``VmHWM`` (``RssAnon``, ``RssFile``) on Linux,
    else the peak for both."""
    status = Path("/proc/self/status")
    if status.exists():
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        if "VmRSS" in fields and "VmHWM" in fields:
            return MemoryUsage(
                rss_bytes=_kib(fields["VmRSS"]),
                peak_rss_bytes=_kib(fields["VmHWM"]),
                anonymous_bytes=_kib(fields.get("RssAnon", "0")),
                file_bytes=_kib(fields.get("RssFile", "0")),
            )
    import resource  # not on Windows; Linux takes the branch above

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes
    return MemoryUsage(rss_bytes=peak_bytes, peak_rss_bytes=peak_bytes)


def _kib(value: str) -> int:
    return int(value.split()[0]) * 1024  # "12345 kB"


def measure_serving(
    package: str | Path, *, threads: int | None = None, file_backed_prepacks: bool = False
) -> ServingFootprint:
    """Import the runtime, load ``package`` (its prepacks file-backed if asked: their pages
    count as file-backed weights), answer one request; measure memory at each step.

    Call it in a fresh process (``measure_serving_in_subprocess``): memory that the process
    already holds counts as the package's.
    """
    from edgeinfer.config import RuntimeConfig, default_cache_dir
    from edgeinfer.manifest import Manifest
    from edgeinfer.package_io import DecoderIO
    from edgeinfer.runtime import ClassifyModel, EmbedModel, GenerateModel, load, memory
    from edgeinfer.runtime.generate.lm_tokenizer import JsonTokenizer, load_tokenizer

    folder = Path(package)
    libraries = memory_usage()
    manifest = Manifest.read(folder)
    tokenizer_file = getattr(manifest.io, "tokenizer", None)
    tokenizer = 0
    if tokenizer_file:  # loaded alone first: what it holds, the model's own copy aside
        io = manifest.io  # a decoder's light tokenizer where it ships one
        path = folder / tokenizer_file
        loaded = load_tokenizer(folder, io) if isinstance(io, DecoderIO) else JsonTokenizer(path)
        memory.release_heap()
        tokenizer = max(0, memory_usage().anonymous_bytes - libraries.anonymous_bytes)
        del loaded
        memory.release_heap()
    model = load(
        folder, config=RuntimeConfig(threads=threads, file_backed_prepacks=file_backed_prepacks)
    )
    kv_tokens = kv_per_token = 0
    if isinstance(model, GenerateModel):
        result = model.generate(SAMPLE_PROMPT, max_new_tokens=SAMPLE_NEW_TOKENS)
        lm = manifest.io_as(DecoderIO)
        itemsize = 2 if lm.kv_dtype == "float16" else 4
        kv_per_token = 2 * lm.num_layers * lm.num_kv_heads * lm.head_dim * itemsize
        kv_tokens = result.prompt_tokens + len(result.token_ids)
    elif isinstance(model, ClassifyModel):
        model.classify(list(SAMPLE_TEXTS))
    elif isinstance(model, EmbedModel):
        model.embed(list(SAMPLE_TEXTS))
    else:
        raise ConfigError(
            f"the footprint serves text and generate packages; {folder} is {model.task!r}"
        )
    serving = memory_usage()
    weights = [folder, default_cache_dir() / "prepacked"] if file_backed_prepacks else [folder]
    found = breakdown_of(
        weights, libraries, serving, tokenizer=tokenizer, kv_bytes_per_token=kv_per_token,
        kv_tokens=kv_tokens,
    )  # fmt: skip
    model.close()
    return ServingFootprint(
        package=str(package),
        task=model.task,
        machine=platform.machine(),
        libraries=libraries,
        serving=serving,
        distributions=tuple(distribution_sizes(loaded_distributions())),
        breakdown=found,
    )


def breakdown_of(
    weights: Sequence[Path],
    libraries: MemoryUsage,
    serving: MemoryUsage,
    *,
    tokenizer: int = 0,
    kv_bytes_per_token: int = 0,
    kv_tokens: int = 0,
) -> Breakdown:
    """Split ``serving`` (this process now) against ``libraries`` (after the imports): the
    resident pages of files in ``weights`` (the package, the prepack cache), the tokenizer and
    KV cache as measured, the rest."""
    from edgeinfer.runtime import memory

    inside = tuple(str(Path(folder).resolve()) + "/" for folder in weights)
    file_weights = sum(
        m.rss_bytes - m.anonymous_bytes for m in memory.mappings() if m.path.startswith(inside)
    )
    kv = kv_bytes_per_token * kv_tokens
    return Breakdown(
        runtime_and_python=libraries.rss_bytes,
        tokenizer=tokenizer,
        file_weights=file_weights,
        anonymous_weights=max(
            0, serving.anonymous_bytes - libraries.anonymous_bytes - tokenizer - kv
        ),
        kv_cache=kv,
        other_files=max(0, serving.file_bytes - libraries.file_bytes - file_weights),
        kv_bytes_per_token=kv_bytes_per_token,
    )


def measure_serving_in_subprocess(
    package: str | Path,
    *,
    threads: int | None = None,
    python: str = sys.executable,
    timeout_s: float = 900.0,
    file_backed_prepacks: bool = False,
) -> ServingFootprint:
    """``measure_serving`` in a fresh ``python`` process (default: this interpreter).

    Raises:
        InferenceError: the process failed or timed out (its last error line is quoted).
    """
    command = [python, "-m", "edgeinfer.bench.footprint", str(package), "--json"]
    command += ["--threads", str(threads)] if threads is not None else []
    command += ["--file-backed-prepacks"] if file_backed_prepacks else []
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise InferenceError(
            f"measuring the footprint of {package} took over {timeout_s:.0f} s; "
            "run `python -m edgeinfer.bench.footprint PKG` to see where it stops"
        ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InferenceError(f"measuring the footprint of {package} failed: {last}")
    return ServingFootprint.from_dict(json.loads(done.stdout))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m edgeinfer.bench.footprint PKG [--threads N] [--file-backed-prepacks]
    [--json]``; exit 2 on an error."""
    parser = argparse.ArgumentParser(
        prog="python -m edgeinfer.bench.footprint", description=__doc__
    )
    parser.add_argument("package", help="package folder")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    parser.add_argument("--json", action="store_true", help="print as JSON")
    parser.add_argument("--file-backed-prepacks", action="store_true", help="prepacks in files")
    args = parser.parse_args(argv)
    try:
        found = measure_serving(
            args.package, threads=args.threads, file_backed_prepacks=args.file_backed_prepacks
        )
    except EdgeInferError as exc:
        sys.stderr.write(f"error ({exc.code}): {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(found.to_dict(), indent=2) + "\n")
        return 0
    rss, peak, alone = (found.serving.rss_bytes, found.serving.peak_rss_bytes, found.libraries)
    sys.stdout.write(
        f"{found.package} ({found.task}, {found.machine}): RSS {rss / 1e6:.0f} MB serving "
        f"(peak {peak / 1e6:.0f}, libraries alone {alone.rss_bytes / 1e6:.0f}); the "
        f"distributions it imported: {found.installed_bytes / 1e6:.1f} MB installed\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
