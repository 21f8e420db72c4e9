"""onnxruntime sessions: options chosen on purpose, ORT errors translated at the boundary."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import InferenceError, PackageError, RunTimeoutError
from edgeinfer.providers import with_options
from edgeinfer.runtime import memory, prepacked
from edgeinfer.runtime.watchdog import RunLimit

__all__ = ["GraphSession", "mark_profile_start", "open_session", "session_options"]


def session_options(
    config: RuntimeConfig, *, graph: Path | None = None, optimized: bool = False
) -> Any:
    """onnxruntime ``SessionOptions`` for ``config``: threads, spinning and optimization level;
    with ``config.profile_dir``, the profiler on, its file named ``<ns>.<graph stem>_*.json``
    where ``<ns>`` is ``time.time_ns()`` just before the session starts (a unique name; the
    profiler's own start is written beside it by ``mark_profile_start``). ``optimized``: the
    graph was saved by onnxruntime already optimized for this machine (``runtime.prepacked``),
    so it is not optimized again."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    # Export already ran the transformer fusions; ENABLE_ALL adds the CPU layout transforms.
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if optimized
        else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    so.intra_op_num_threads = config.intra_op_threads
    # One graph at a time per request: a second pool would only compete for the same cores.
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if config.spin_wait else "0")
    so.log_severity_level = 3
    if config.profile_dir is not None:
        so.enable_profiling = True
        stem = graph.stem if graph is not None else "graph"
        so.profile_file_prefix = str(config.profile_dir / f"{time.time_ns()}.{stem}")
    return so


def mark_profile_start(session: Any, options: Any) -> None:
    """With the profiler on, write the time its clock started (``time.time_ns()``'s clock, read
    from onnxruntime) to ``<prefix>.start``: its events' ``ts`` count from it, so
    ``bench.profile`` places them on the request's clock exactly, however long the session
    took to start on a loaded machine."""
    if options.enable_profiling:
        start = session.get_profiling_start_time_ns()
        Path(f"{options.profile_file_prefix}.start").write_text(str(start), encoding="utf-8")


def open_session(graph: Path, *, providers: list[str], config: RuntimeConfig) -> tuple[Any, Path]:
    """An onnxruntime ``InferenceSession`` of the package graph ``graph`` (its file-backed
    prepacked copy when ``config`` asks, ``runtime.prepacked``), and the file it loaded (by the
    name that outlasts the load: the session maps the ``.data`` file beside it).
    onnxruntime's own exceptions pass through: the caller says which package failed."""
    import onnxruntime as ort

    with prepacked.graph_to_load(
        graph,
        providers=providers,
        config=config,
        options=lambda: session_options(config, graph=graph),
    ) as (to_open, loaded):
        options = session_options(config, graph=graph, optimized=loaded != graph)
        session = ort.InferenceSession(
            str(to_open),
            providers=with_options(providers, package=graph.parent),
            sess_options=options,
        )
    mark_profile_start(session, options)
    return session, loaded


class GraphSession:
    """One ONNX graph loaded into an onnxruntime ``InferenceSession``.

    Args:
        path: the ``.onnx`` file.
        providers: ORT provider names in order (already resolved).
        config: thread and spin settings; ``run_timeout_s`` bounds every run.
    """

    def __init__(self, path: Path, *, providers: list[str], config: RuntimeConfig) -> None:
        try:
            self._session, _ = open_session(path, providers=providers, config=config)
        except Exception as exc:  # ORT raises its own pybind classes, not a public hierarchy
            raise PackageError(
                f"onnxruntime could not load {path.name}: {exc}. The file is corrupt or was "
                "exported for a newer onnxruntime; re-export the package"
            ) from exc
        self.path = path
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.output_names = [o.name for o in self._session.get_outputs()]
        self.providers: list[str] = list(self._session.get_providers())
        self._limit = RunLimit(timeout_s=config.run_timeout_s, graph=path.name)

    def run(
        self, feeds: Mapping[str, np.ndarray], *, shrink_arena: bool = False
    ) -> list[np.ndarray]:
        """Run the graph on ``feeds`` (only the inputs it takes) and return all outputs;
        ``shrink_arena`` hands the CPU arena's growth of this run back to the system. A run past
        its limit (``RuntimeConfig.run_timeout_s``, the caller's ``watchdog.deadline``) is
        stopped: ``RunTimeoutError``, and the session serves the next run as before."""
        try:
            given = {k: feeds[k] for k in self.input_names}
        except KeyError as exc:
            raise InferenceError(f"graph input {exc} was not provided") from exc
        try:
            outputs = list(
                self._limit.call(
                    lambda options: self._session.run(self.output_names, given, options),
                    options=_shrink if shrink_arena else None,
                )
            )
        except RunTimeoutError:
            raise
        except Exception as exc:  # ORT raises its own pybind classes, not a public hierarchy
            raise InferenceError(f"onnxruntime failed to run the graph: {exc}") from exc
        if shrink_arena:
            memory.release_heap()  # what the arena gave back to malloc, back to the kernel
        return outputs


def _shrink(options: Any) -> None:
    """Run options that hand the CPU arena's growth of the run back when it ends."""
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
