"""``RawModel``: ``raw`` packages, any graph, named tensors in and out, with the state of a
stateful graph carried from one call to the next of the same stream.

A stream is a caller's name for one sequence of calls (a microphone, a camera, a device). Its
state starts as zeros (the shapes measured at export, ``io.state``), is fed to the graph's state
inputs and replaced by the state outputs after every call. At most ``MAX_STREAMS`` streams are
kept; the least recently used one is forgotten first (its next call starts afresh).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import InputError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import RawIO
from edgeinfer.runtime.model import Model

__all__ = ["MAX_STREAMS", "RawModel"]

log = logging.getLogger(__name__)

# Streams kept at once: a VAD's state is a few KB, so 1,024 streams cost a few MB at most.
MAX_STREAMS: Final = 1024
_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


class _Stream:
    """One stream's state arrays (state input name -> array) and the lock of its calls."""

    def __init__(self, states: dict[str, np.ndarray]) -> None:
        self.states = states
        self.lock = threading.Lock()


class RawModel(Model):
    """A ``raw`` package: named arrays in and out, optionally stateful per stream.
    ``RawModel.load`` loads one (a ``PackageError`` for another kind); ``edgeinfer.load``
    returns one for such a package."""

    TASK = "raw"
    IO_KINDS = ("raw",)

    def __init__(self, path: Path, manifest: Manifest, *, config: RuntimeConfig) -> None:
        super().__init__(path, manifest, config=config)
        self._io = manifest.io_as(RawIO)
        self._graph = self._open_graph(self._io.graph)
        self.providers = self._graph.providers
        self._state_inputs = {s.input: s for s in self._io.state}
        self._state_outputs = {s.output for s in self._io.state}
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._lock = threading.Lock()  # guards the stream table, never a graph run

    def _zeros(self) -> dict[str, np.ndarray]:
        return {
            s.input: np.zeros(s.shape, _DTYPES.get(s.dtype, np.float32)) for s in self._io.state
        }

    def _stream(self, name: str) -> _Stream:
        """The stream named ``name``, created with zero state (forgetting the oldest)."""
        with self._lock:
            stream = self._streams.get(name)
            if stream is None:
                stream = self._streams[name] = _Stream(self._zeros())
                while len(self._streams) > MAX_STREAMS:
                    dropped, _ = self._streams.popitem(last=False)
                    log.warning(
                        "raw package %s: forgot stream %r (over %d)",
                        self.path.name,
                        dropped,
                        MAX_STREAMS,
                    )
            self._streams.move_to_end(name)
            return stream

    def _check(self, feeds: Mapping[str, Any], *, stream: str | None) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise InputError("feeds must be a mapping of input name -> array")
        known = {spec.name: spec for spec in self._io.inputs}
        unknown = sorted(set(feeds) - set(known))
        if unknown:
            raise InputError(f"{self.path.name} has no inputs {unknown}; it takes {sorted(known)}")
        if stream is not None:
            given = sorted(set(feeds) & set(self._state_inputs))
            if given:
                raise InputError(f"{given} are the stream's state: do not pass them with a stream")
        arrays: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            array = np.asarray(value)
            want = known[name].dtype
            if want in _DTYPES and array.dtype != _DTYPES[want]:
                if array.dtype.kind != np.dtype(_DTYPES[want]).kind:
                    raise InputError(f"input {name} takes {want}, got {array.dtype}")
                array = array.astype(_DTYPES[want])
            _check_shape(name, array, known[name].shape)
            arrays[name] = array
        missing = sorted(set(known) - set(arrays) - set(self._state_inputs))
        if missing:
            raise InputError(f"{self.path.name} needs the inputs {missing}")
        return arrays

    def run(self, feeds: Mapping[str, Any], *, stream: str | None = None) -> dict[str, np.ndarray]:
        """Run the package's graph: input name -> array in, output name -> array out.

        With ``stream`` (any name: a microphone, a device), a stateful graph's state inputs
        come from that stream's previous call (zeros on its first) and its state outputs are
        kept for the next one instead of being returned; without it, every call stands alone
        (state inputs not in ``feeds`` start as zeros). See docs/onnx.md.
        """
        arrays = self._check(feeds, stream=stream)
        started = time.perf_counter()
        if stream is None:
            outputs = self._run({**self._zeros(), **arrays})
        else:
            entry = self._stream(stream)
            with entry.lock:  # one call at a time per stream: states advance in order
                outputs = self._run({**arrays, **entry.states})
                for spec in self._io.state:
                    entry.states[spec.input] = outputs[spec.output]
            outputs = {k: v for k, v in outputs.items() if k not in self._state_outputs}
        elapsed_ms = (time.perf_counter() - started) * 1e3
        self._metrics.observe("raw", "compute", elapsed_ms)
        self._metrics.observe("raw", "end_to_end", elapsed_ms)
        return outputs

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._graph.run(feeds)
        return dict(zip(self._graph.output_names, values, strict=True))

    def end_stream(self, stream: str) -> None:
        """Forget ``stream``'s state (its next call starts from zeros)."""
        with self._lock:
            self._streams.pop(stream, None)

    @property
    def streams(self) -> int:
        """How many streams are kept now."""
        with self._lock:
            return len(self._streams)


def _check_shape(name: str, array: np.ndarray, want: tuple[str | int, ...]) -> None:
    """Refuse an array whose rank or fixed dimensions differ from the graph's input, naming
    both (onnxruntime would fail with a message about its own internals)."""
    fits = array.ndim == len(want) and all(
        not isinstance(dim, int) or dim <= 0 or dim == size  # 0: a dimension ONNX leaves unnamed
        for dim, size in zip(want, array.shape, strict=True)
    )
    if array.size == 0:
        raise InputError(f"input {name} is empty (shape {list(array.shape)})")
    if not fits:
        shape = [dim if isinstance(dim, int) else str(dim) for dim in want]
        raise InputError(
            f"input {name} takes shape {shape} (named dimensions are free), got {list(array.shape)}"
        )
