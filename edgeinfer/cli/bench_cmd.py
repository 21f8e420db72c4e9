"""``edgeinfer bench PKG``: latency percentiles, cold start, throughput and memory vs baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import EXIT_CHECK_FAILED, console, print_json
from edgeinfer.errors import ConfigError

__all__ = ["bench"]


def bench(
    package: Annotated[Path, typer.Argument(help="package to measure")],
    baseline: Annotated[
        list[str] | None,
        typer.Option(
            help="'torch' (the source model in PyTorch eager) or another package; repeatable. "
            "Generate packages: 'llama.cpp' (its source GGUF on llama.cpp) or "
            "'llama.cpp:FILE.gguf'"
        ),
    ] = None,
    runs: Annotated[int, typer.Option(help="timed runs per candidate")] = 200,
    warmup: Annotated[int, typer.Option(help="untimed runs first")] = 20,
    seq_len: Annotated[int, typer.Option(help="tokens per text")] = 32,
    batch: Annotated[int, typer.Option(help="texts per request")] = 1,
    threads: Annotated[int | None, typer.Option(help="threads for every candidate")] = None,
    rounds: Annotated[int, typer.Option(help="interleaved blocks per candidate")] = 5,
    tokens: Annotated[int, typer.Option(help="decode tokens (generate packages)")] = 64,
    concurrency: Annotated[
        str | None,
        typer.Option(
            help="generate packages: stream counts, e.g. 1,2,4,8: that many generations at once "
            "(beside llama.cpp with as many slots when --baseline llama.cpp[:FILE] is given)"
        ),
    ] = None,
    min_speedup: Annotated[
        float | None, typer.Option(help="exit 1 if the p50 speedup over any baseline is lower")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="write a latency box plot (PNG)")] = None,
    early_exit_curve: Annotated[
        bool, typer.Option(help="early-exit package: accuracy vs latency over exit thresholds")
    ] = False,
    limit: Annotated[
        int | None, typer.Option(help="--early-exit-curve: cap the held-out inputs", min=1)
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Measure PACKAGE (and baselines, in the same run) and print p50/p95/p99."""
    from edgeinfer.bench import report
    from edgeinfer.bench.runner import BenchConfig, Candidate, run_bench
    from edgeinfer.manifest import Manifest

    config = BenchConfig(
        runs=runs, warmup=warmup, seq_len=seq_len, batch=batch, threads=threads, rounds=rounds
    )
    if early_exit_curve:
        _bench_early_exit(package, threads, limit, plot=plot, json_output=json_output)
        return
    manifest = Manifest.read(package)
    if concurrency is not None:
        if manifest.task != "generate":
            raise ConfigError(f"--concurrency takes a generate package; {package} is not one")
        _bench_concurrency(
            package,
            _stream_counts(concurrency),
            baseline or [],
            config.thread_count,
            tokens,
            rounds=rounds,
            json_output=json_output,
        )
        return
    if manifest.task == "generate":
        speedups = _bench_generate(
            package,
            baseline or [],
            config.thread_count,
            tokens,
            rounds=rounds,
            plot=plot,
            json_output=json_output,
        )
        _check_budget(speedups, min_speedup)
        return
    subject = Candidate(f"{package.name} ({manifest.precision})", "package", package)
    baselines = []
    for name in baseline or []:
        if name == "torch":
            baselines.append(Candidate("pytorch eager (fp32)", "torch", package))
        else:
            other = Manifest.read(Path(name))
            baselines.append(
                Candidate(f"{Path(name).name} ({other.precision})", "package", Path(name))
            )
    with console.status(f"benchmarking {len(baselines) + 1} candidate(s) …"):
        result = run_bench(subject, baselines, config)
    if plot is not None:
        report.plot(result, plot)
    if json_output:
        print_json(result.to_dict())
    else:
        console.print(report.table(result), soft_wrap=True)
        if plot is not None:
            console.print(f"plot written to {plot}")
    _check_budget(result.speedups, min_speedup)


def _check_budget(speedups: dict[str, float], min_speedup: float | None) -> None:
    """Exit 1 when the subject is less than ``min_speedup`` times faster than a baseline."""
    if min_speedup is None:
        return
    slow = {k: v for k, v in speedups.items() if v < min_speedup}
    if slow:
        console.print(
            f"[red]speedup below {min_speedup}x[/]: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in slow.items())
        )
        raise typer.Exit(EXIT_CHECK_FAILED)


def _bench_generate(
    package: Path,
    baselines: list[str],
    threads: int,
    tokens: int,
    *,
    rounds: int,
    plot: Path | None,
    json_output: bool,
) -> dict[str, float]:
    """Decode speed of a generate package (and of package, llama.cpp and PyTorch baselines);
    returns the subject's tokens/s speedup over each baseline."""
    from edgeinfer.bench import generation, report

    ggufs = _ggufs(package, baselines)
    others = [Path(n) for n in baselines if n != "torch" and not n.startswith("llama.cpp")]
    torch_source = generation.source_spec(package) if "torch" in baselines else None
    with console.status(f"benchmarking generation of {package.name} …"):
        result = generation.run_generation_bench(
            [package, *others],
            threads=threads,
            tokens=tokens,
            torch_source=torch_source,
            llamacpp=ggufs,
            rounds=rounds,
        )
    if plot is not None:
        report.generation_plot(result, plot)
    rows = result["packages"]
    subject_rate = rows[0]["decode_tokens_per_s"]
    speedups = {
        f"{Path(r['package']).name} ({r['precision']})": subject_rate / r["decode_tokens_per_s"]
        for r in rows[1:]
    }
    for row in result.get("llamacpp", []):
        speedups[f"llama.cpp {Path(row['gguf']).name}"] = subject_rate / row["decode_tokens_per_s"]
    if "torch" in result:
        speedups[result["torch"]["baseline"]] = rows[0]["speedup_vs_torch"]
    if json_output:
        for row in rows:
            row.pop("inter_token_samples_ms")
        print_json({**result, "speedup_tokens_per_s": speedups})
    else:
        console.print(report.generation_table(result), soft_wrap=True)
    return speedups


def _ggufs(package: Path, baselines: list[str]) -> list[Path]:
    """The GGUF files that ``--baseline llama.cpp[:FILE]`` names (bare: the package's source),
    each once."""
    from edgeinfer.bench.generation import source_gguf

    ggufs = [
        Path(name.split(":", 1)[1]) if ":" in name else source_gguf(package)
        for name in baselines
        if name == "llama.cpp" or name.startswith("llama.cpp:")
    ]
    return list(dict.fromkeys(ggufs))  # a file named twice is measured once


def _stream_counts(text: str) -> list[int]:
    """``--concurrency 1,2,4,8`` as stream counts."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise ConfigError(f"--concurrency takes stream counts like 1,2,4,8, got {text!r}") from exc


def _bench_concurrency(
    package: Path,
    counts: list[int],
    baselines: list[str],
    threads: int,
    tokens: int,
    *,
    rounds: int,
    json_output: bool,
) -> None:
    """C generations at once, beside llama.cpp with C slots (docs/generation.md)."""
    from edgeinfer.bench.concurrency import concurrency_table, run_concurrency_bench

    ggufs = _ggufs(package, baselines)
    others = [b for b in baselines if b != "llama.cpp" and not b.startswith("llama.cpp:")]
    if others or len(ggufs) > 1:
        raise ConfigError(
            "--concurrency compares with one llama.cpp file: --baseline llama.cpp[:FILE]"
        )
    with console.status(f"benchmarking {package.name} at {', '.join(map(str, counts))} streams …"):
        result = run_concurrency_bench(
            package,
            concurrency=counts,
            threads=threads,
            tokens=tokens,
            gguf=ggufs[0] if ggufs else None,
            rounds=rounds,
        )
    if json_output:
        print_json(result)
    else:
        console.print(concurrency_table(result), soft_wrap=True)


def _bench_early_exit(
    package: Path, threads: int | None, limit: int | None, *, plot: Path | None, json_output: bool
) -> None:
    """The accuracy/latency curve of an early-exit package (docs/early_exit.md)."""
    from edgeinfer.bench.early_exit_curve import curve_table, plot_curve, run_curve

    with console.status(f"tracing {package.name} on the held-out split …"):
        result = run_curve(package, threads=threads, limit=limit)
    if plot is not None:
        plot_curve(result, plot)
    if json_output:
        print_json(result)
        return
    console.print(curve_table(result), soft_wrap=True)
    if plot is not None:
        console.print(f"plot written to {plot}")
