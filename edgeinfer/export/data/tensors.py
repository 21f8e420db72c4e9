"""Tensor data for ``raw`` exports: calibration and held inputs of any graph, as streams.

A stream is a sequence of calls whose state (if the graph has any) carries from one call to
the next; a stateless graph's samples are streams of one call each. Files:

- ``.npz``: one array per input name, the first axis indexing the calls (a 0-d array is the
  same value for every call: a sample rate, a flag). A state input may be left out (it starts
  as zeros). For a stateful graph one file is one stream; for a stateless one, its rows are
  independent samples.
- ``.npy``: the same for a graph with a single input to feed.
- a folder of ``.npz``/``.npy`` files, sorted by name.

When no held data is given, the last quarter of the streams of the calibration data is held
out (a single stateful stream is cut in two): the gate never sees a calibration sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.package_io import TensorSpec

__all__ = ["Feeds", "Stream", "describe", "read_streams", "split_held"]

Feeds = dict[str, np.ndarray]
Stream = list[Feeds]
_MAX_CALLS = 100_000  # calls per file at most: a bound on what a mistaken file can cost


def _arrays(path: Path, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """The arrays of one file, by input name."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: np.asarray(data[name]) for name in data.files}
        else:
            if len(inputs) != 1:
                names = [spec.name for spec in inputs]
                raise ConfigError(
                    f"{path} is a .npy file, but the graph takes several inputs {names}: "
                    "pass a .npz file with one array per input name"
                )
            arrays = {inputs[0].name: np.load(path, allow_pickle=False)}
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot read tensor data {path}: {exc}") from exc
    known = {spec.name for spec in inputs}
    unknown = sorted(set(arrays) - known)
    if unknown:
        raise ConfigError(f"{path} holds {unknown}; the graph takes {sorted(known)}")
    return arrays


def _calls(path: Path, arrays: dict[str, np.ndarray], inputs: Sequence[TensorSpec]) -> Stream:
    """One feeds dict per call: row i of every array (0-d arrays repeat)."""
    counts = {len(a) for a in arrays.values() if a.ndim > 0}
    if len(counts) != 1:
        raise ConfigError(
            f"{path}: every array's first axis counts the calls and must agree, got "
            f"{ {k: list(v.shape) for k, v in arrays.items()} }"
        )
    (count,) = counts
    if not 0 < count <= _MAX_CALLS:
        raise ConfigError(f"{path} holds {count} calls; expected 1 to {_MAX_CALLS}")
    ranks = {spec.name: len(spec.shape) for spec in inputs}
    calls: Stream = []
    for i in range(count):
        feeds: Feeds = {}
        for name, array in arrays.items():
            value = array if array.ndim == 0 else array[i]
            if value.ndim != ranks[name] and value.ndim + 1 == ranks[name]:
                value = value[None]  # a call's batch axis of 1, left out in the file
            feeds[name] = np.array(value)  # a contiguous copy; 0-d stays 0-d
        calls.append(feeds)
    return calls


def read_streams(path: Path, inputs: Sequence[TensorSpec], *, stateful: bool) -> list[Stream]:
    """The streams held by ``path`` (a ``.npz``/``.npy`` file or a folder of them)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
        if not files:
            raise ConfigError(f"{path} holds no .npz or .npy files")
    elif path.is_file() and path.suffix in (".npz", ".npy"):
        files = [path]
    elif path.exists():
        raise ConfigError(f"{path}: tensor data must be a .npz or .npy file, or a folder of them")
    else:
        raise ConfigError(f"tensor data {path} does not exist")
    streams: list[Stream] = []
    for file in files:
        calls = _calls(file, _arrays(file, inputs), inputs)
        streams.extend([calls] if stateful else [[call] for call in calls])
    return streams


def split_held(streams: list[Stream]) -> tuple[list[Stream], list[Stream]]:
    """(calibration, held): the last quarter of the streams held out, at least one each."""
    if len(streams) == 1:
        calls = streams[0]
        if len(calls) < 2:
            raise ConfigError(
                "the calibration data holds one call: nothing can be held out for the gate; "
                "pass more data or --eval-data"
            )
        half = len(calls) // 2
        return [calls[:half]], [calls[half:]]
    held = max(1, len(streams) // 4)
    return streams[:-held], streams[-held:]


def describe(streams: list[Stream]) -> dict[str, Any]:
    """Counts for the report."""
    return {"streams": len(streams), "calls": sum(len(s) for s in streams)}
