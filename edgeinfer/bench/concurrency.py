"""``edgeinfer bench PKG --concurrency 1,2,4,8``: C generations at once on one generate package
(the runtime's continuous batching, C slots; C = 1 is the package as ``edgeinfer.load`` gives
it by default, the solo path) beside llama.cpp's server with C parallel slots (continuous
batching on), in the same run.

Each stream has its own prompt (``Write a short story about a ...``, one subject per stream,
through the package's chat template; the same token ids to both engines) and generates
``tokens`` decode tokens after its first (greedy, eos ignored). Every engine and slot count runs
in its own process (``concurrency_worker``); at each C the engines' rounds are interleaved.
Both engines are clocked the same way, by the Python thread that consumes each stream
(``time.perf_counter`` at each token's arrival, not an engine's own timings):

- aggregate decode tokens/s: the decode tokens of all C streams (``tokens`` each) over the wall
  time from the first stream's first token to the last stream's last token; median over the
  rounds. ``scaling`` is aggregate(C) / aggregate(1).
- steady aggregate tokens/s: the same while all C streams decode (the window from the last
  stream's first token to the first stream's last: no prefill of a newcomer in it), the figure
  continuous batching reaches once a gateway is busy; with its own ``steady_scaling`` and the
  inter-token p50 of the gaps inside that window (None when no round has a token land inside
  it: too few tokens for the window to hold a gap).
- per-stream decode tokens/s: ``tokens`` over that stream's first-to-last token time; median
  over streams and rounds. Inter-token p50/p99: every gap between a stream's consecutive
  tokens, pooled over streams and rounds. TTFT: submission to first token, p50 and max.
- identical: every stream of every round equals its prompt run alone (C = 1: for ours the
  default ``load()`` path) on the same engine (token ids for ours; text for llama.cpp, whose
  wheel does not report every id). ``vs 1 stream`` is the aggregate over the solo path's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from edgeinfer.bench.generation import prompt_ids
from edgeinfer.errors import ConfigError, EdgeInferError
from edgeinfer.manifest import Manifest

__all__ = ["SUBJECTS", "concurrency_table", "run_concurrency_bench"]

# One story per stream: different texts of nearly the same token count.
SUBJECTS = (
    "lighthouse keeper",
    "mountain guide",
    "night train driver",
    "village baker",
    "forest ranger",
    "river ferryman",
    "museum guard",
    "street musician",
    "clock repairer",
    "radio operator",
    "ship's cook",
    "city gardener",
    "glass blower",
    "desert nomad",
    "snow plough driver",
    "beekeeper",
)


def _prompts(package: Path, count: int) -> list[list[int]]:
    """``count`` stream prompts as the package encodes them."""
    return [
        prompt_ids(package, [{"role": "user", "content": f"Write a short story about a {s}."}])
        for s in SUBJECTS[:count]
    ]


def _level(runs: list[list[dict[str, Any]]], solo: list[Any]) -> dict[str, Any]:
    """One engine at one C: the rates, gaps and TTFTs of its rounds (the module docstring)."""
    aggregate: list[float] = []
    per_stream: list[float] = []
    gaps: list[float] = []
    ttft: list[float] = []
    steady: list[float] = []
    steady_gaps: list[float] = []
    identical, held_back = True, 0
    for streams in runs:
        for index, stream in enumerate(streams):
            arrivals = stream["arrivals_s"]
            if arrivals[-1] <= arrivals[0]:
                raise EdgeInferError("a stream delivered all its tokens at once; raise --tokens")
            per_stream.append((stream["generated"] - 1) / (arrivals[-1] - arrivals[0]))
            gaps.extend(np.diff(arrivals) * 1e3)
            ttft.append((arrivals[0] - stream["submitted_s"]) * 1e3)
            identical = identical and stream["output"] == solo[index]
            held_back += stream["held_back"]
        decoded = sum(s["generated"] - 1 for s in streams)
        span_s = max(s["arrivals_s"][-1] for s in streams) - min(
            s["arrivals_s"][0] for s in streams
        )
        aggregate.append(decoded / span_s)
        low = max(st["arrivals_s"][0] for st in streams)
        high = min(st["arrivals_s"][-1] for st in streams)
        inside = [np.array([t for t in st["arrivals_s"] if low <= t <= high]) for st in streams]
        within = sum(max(len(t) - 1, 0) for t in inside)  # tokens whose gap lies inside
        if high > low and within:  # else too short a window to measure (a rate of 0 is not)
            steady.append(within / (high - low))
            steady_gaps.extend(g for t in inside for g in np.diff(t) * 1e3)
    return {
        "aggregate_tokens_per_s": round(float(np.median(aggregate)), 1),
        "steady_tokens_per_s": round(float(np.median(steady)), 1) if steady else None,
        "steady_inter_token_ms_p50": (
            round(float(np.percentile(steady_gaps, 50)), 2) if steady_gaps else None
        ),
        "per_stream_tokens_per_s": round(float(np.median(per_stream)), 1),
        "inter_token_ms": {
            "p50": round(float(np.percentile(gaps, 50)), 2),
            "p99": round(float(np.percentile(gaps, 99)), 2),
        },
        "ttft_ms": {"p50": round(float(np.median(ttft)), 1), "max": round(float(max(ttft)), 1)},
        "identical": identical,
        # tokens that arrived in another token's chunk (llama.cpp, mid-UTF-8); 0 for ours
        "held_back_tokens": held_back,
    }


def _measure_level(
    engines: list[tuple[str, Path]],
    prompts: list[list[int]],
    *,
    concurrency: int,
    references: list[list[int]],
    threads: int,
    tokens: int,
    rounds: int,
) -> list[tuple[list[Any], list[list[dict[str, Any]]]]]:
    """Each engine with ``concurrency`` slots in its own process, the rounds interleaved:
    (its solo outputs of ``references``, its runs)."""
    from edgeinfer.bench.runner import Candidate, interleaved_rounds

    candidates = [Candidate(p.name, kind, p) for kind, p in engines]  # type: ignore[arg-type]
    extra = {
        "prompts": prompts[:concurrency],
        "references": references,
        "tokens": tokens,
        "concurrency": concurrency,
    }
    measured = interleaved_rounds(
        candidates,
        threads,
        module="edgeinfer.bench.concurrency_worker",
        extra=extra,
        rounds=rounds,
    )
    return [
        (loaded["solo"], [run for reply in replies for run in reply["runs"]])
        for loaded, replies in measured
    ]


def run_concurrency_bench(
    package: Path,
    *,
    concurrency: list[int],
    threads: int,
    tokens: int,
    gguf: Path | None = None,
    rounds: int = 3,
) -> dict[str, Any]:
    """Measure ``package`` (and llama.cpp on ``gguf``) at each stream count of ``concurrency``
    (1 is always measured: the solo runs are the reference); see the module docstring."""
    if tokens < 1 or rounds < 1:
        raise ConfigError(f"tokens and rounds must be >= 1, got {tokens} and {rounds}")
    levels = sorted({1, *concurrency})
    if levels[0] < 1 or levels[-1] > len(SUBJECTS):
        raise ConfigError(f"--concurrency takes stream counts in [1, {len(SUBJECTS)}]")
    prompts = _prompts(package, levels[-1])
    engines = [("package", package)] + ([("llamacpp", gguf)] if gguf is not None else [])
    names = ["ours", "llamacpp"][: len(engines)]
    solo: dict[str, list[Any]] = {}
    rows = []
    for level in levels:
        measured = _measure_level(
            engines,
            prompts,
            concurrency=level,
            references=prompts if level == 1 else [],  # every prompt alone, once
            threads=threads,
            tokens=tokens,
            rounds=rounds,
        )
        row: dict[str, Any] = {"concurrency": level}
        for name, (references, runs) in zip(names, measured, strict=True):
            solo.setdefault(name, references)
            row[name] = _level(runs, solo[name])
        rows.append(row)
    for name in names:
        alone = rows[0][name]["aggregate_tokens_per_s"]
        for row in rows:
            m = row[name]
            m["scaling"] = round(m["aggregate_tokens_per_s"] / alone, 2)
            steady = m["steady_tokens_per_s"]
            m["steady_scaling"] = None if steady is None else round(steady / alone, 2)
    if gguf is not None:
        for row in rows:
            ours, theirs = row["ours"], row["llamacpp"]
            row["ours_vs_llamacpp"] = round(
                ours["aggregate_tokens_per_s"] / theirs["aggregate_tokens_per_s"], 2
            )
    return {
        "package": str(package),
        "precision": Manifest.read(package).precision,
        "gguf": None if gguf is None else str(gguf),
        "threads": threads,
        "tokens": tokens,
        "rounds": rounds,
        "prompt_tokens": [len(p) for p in prompts],
        "levels": rows,
    }


def concurrency_table(result: dict[str, Any]) -> Table:
    """A rich table: per stream count, our row then llama.cpp's."""
    lengths = result["prompt_tokens"]
    out = Table(
        title=(
            f"{result['tokens']} decode tokens per stream · prompts {min(lengths)}–"
            f"{max(lengths)} tokens · {result['threads']} threads · {result['rounds']} rounds"
        ),
    )
    labels = {"ours": f"{Path(result['package']).name} ({result['precision']})"}
    if result["gguf"] is not None:
        labels["llamacpp"] = f"llama.cpp {Path(result['gguf']).name}"
    columns = ["streams", "engine", "aggregate tok/s", "vs 1 stream", "all decoding tok/s (x1)"]
    columns += ["per-stream tok/s"]
    columns += ["inter-token p50/p99 ms", "TTFT p50/max ms", "identical to solo"]
    for column in columns + (["ours vs llama.cpp"] if len(labels) > 1 else []):
        out.add_column(column, justify="left" if column == "engine" else "right")
    for row in result["levels"]:
        for name, label in labels.items():
            m = row[name]
            cells = [
                str(row["concurrency"]),
                label,
                f"{m['aggregate_tokens_per_s']:.1f}",
                f"{m['scaling']:.2f}x",
                "-"
                if m.get("steady_scaling") is None
                else f"{m['steady_tokens_per_s']:.1f} ({m['steady_scaling']:.2f}x)",
                f"{m['per_stream_tokens_per_s']:.1f}",
                f"{m['inter_token_ms']['p50']}/{m['inter_token_ms']['p99']}",
                f"{m['ttft_ms']['p50']:.0f}/{m['ttft_ms']['max']:.0f}",
                "yes" if m["identical"] else "no",
            ]
            if len(labels) > 1:  # ours over llama.cpp's aggregate, on our row
                cells.append(f"{row['ours_vs_llamacpp']:.2f}x" if name == "ours" else "")
            out.add_row(*cells)
    return out
