"""What the per-run compute bound costs: the same graph run with the watchdog armed
(``RuntimeConfig(run_timeout_s=60)``, the default) and off (``run_timeout_s=None``: no run
options, no watchdog), and through onnxruntime directly, taking turns block by block.

    PYTHONPATH=. .venv/bin/python benchmarks/run_watchdog_cost.py [--package PKG] [--rounds 40]
        [--block 200] [--json F]

Without ``--package``, the tiny raw package of tests/fast_packages.py (its quiet input: a graph
run of a few µs, so the watchdog's share shows); with one (MiniLM int8), an ``embed`` of a short
text goes through the whole runtime. Prints the median wall µs per run of each and the least
CPU µs of the calling thread per run (the steadier figure on a loaded machine), the armed run's
extra µs over the off one, and ``uptime``'s load (the machine may be loaded: say so with it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import edgeinfer
from edgeinfer.runtime.session import GraphSession

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny package builder the tests use


def _per_run_us(call: Callable[[], Any], block: int) -> tuple[float, float]:
    """(wall µs, this thread's CPU µs) per run over ``block`` runs. On a loaded machine the
    wall time counts the waits for a core too; the thread's CPU time counts only the work (the
    tiny graph runs on one intra-op thread: the caller's)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(block):
        call()
    return (time.perf_counter() - wall) / block * 1e6, (time.thread_time() - cpu) / block * 1e6


def _tiny_calls(folder: Path) -> dict[str, Callable[[], Any]]:
    from fast_packages import tiny_spinner

    graph = tiny_spinner(folder / "spinner") / "model.onnx"
    feeds = {"x": np.zeros((1, 4), np.float32), "spin": np.zeros(1, np.int64)}

    def session(timeout_s: float | None) -> GraphSession:
        config = edgeinfer.RuntimeConfig(threads=1, spin_wait=False, run_timeout_s=timeout_s)
        return GraphSession(graph, providers=["CPUExecutionProvider"], config=config)

    armed, off = session(60.0), session(None)
    ort_session, names = off._session, off.output_names
    return {
        "armed": lambda: armed.run(feeds),
        "off": lambda: off.run(feeds),
        "onnxruntime": lambda: ort_session.run(names, feeds),
    }


def _package_calls(package: Path) -> dict[str, Callable[[], Any]]:
    def model(timeout_s: float | None) -> Any:
        config = edgeinfer.RuntimeConfig(spin_wait=False, run_timeout_s=timeout_s)
        return edgeinfer.load(package, config=config)

    armed, off = model(60.0), model(None)
    text = ["pump pressure rising on line four"]
    return {"armed": lambda: armed.embed(text), "off": lambda: off.embed(text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, help="an embed package (default: the tiny graph)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=200, help="runs per turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        calls = _package_calls(args.package) if args.package else _tiny_calls(Path(tmp))
        for call in calls.values():  # warm: first-run allocations, the watchdog's thread
            _per_run_us(call, args.block)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
        for _ in range(args.rounds):  # interleaved: each round runs every variant once
            for name, call in calls.items():
                samples[name].append(_per_run_us(call, args.block))
    medians = {name: statistics.median(w for w, _ in values) for name, values in samples.items()}
    # The least CPU of a block: the run's own work, the least disturbed by other processes.
    cpu = {name: min(c for _, c in values) for name, values in samples.items()}
    result = {
        "package": str(args.package or "tiny spinner (tests/fast_packages.py)"),
        "median_wall_us_per_run": medians,
        "min_cpu_us_per_run": cpu,
        "armed_minus_off_wall_us": medians["armed"] - medians["off"],
        "armed_minus_off_cpu_us": cpu["armed"] - cpu["off"],
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "block": args.block,
    }
    for name, value in medians.items():
        sys.stdout.write(f"{name:>12}: {value:9.2f} µs/run wall (median), {cpu[name]:9.2f} CPU\n")
    sys.stdout.write(
        f"armed - off: {result['armed_minus_off_wall_us']:+.2f} µs/run wall, "
        f"{result['armed_minus_off_cpu_us']:+.2f} µs CPU; load {result['load']} on "
        f"{result['cpus']} CPUs\n"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
