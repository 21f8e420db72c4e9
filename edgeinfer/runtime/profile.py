"""Where one request's time goes (``edgeinfer profile``): the runtime's own stage timings
(``model.metrics()``: tokenize, compute) joined with onnxruntime's profiler (every kernel of
every graph run, grouped by op type), as a table and a Chrome trace (``chrome://tracing``,
Perfetto).

The package is loaded with the profiler on and no warm-up; the request runs once to warm the
session (allocation, kernel selection), then, after a pause that keeps the two apart on the
profiler's clock, once more: that second run is the one reported. Each session's profile file
is named after ``time.time_ns()`` taken just before the session started, which places its
events on the request's clock to within a few milliseconds (``runtime.session.session_options``).
"""

from __future__ import annotations

import gc
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError, InferenceError

if TYPE_CHECKING:
    from edgeinfer.runtime.chat import Prompt

__all__ = ["Profile", "Stage", "profile"]

# Between the warm-up request and the measured one, and how early a measured event may seem:
# the profiler's clock starts a fraction of a millisecond after its stamp (8 ms measured on a
# loaded machine), so events seem that much early; no warm-up run comes within the margin.
_GAP_S = 0.3
_MARGIN_NS = 150_000_000


@dataclass(frozen=True)
class Stage:
    """One line of the breakdown.

    Attributes:
        name: ``tokenize``, ``graph · MatMul`` (an op type's kernels), ``graph · runtime``
            (onnxruntime's own work between kernels), ``post-process`` and so on.
        ms: its time in the measured request (milliseconds).
        calls: kernel launches or runs it sums (1 for host stages).
    """

    name: str
    ms: float
    calls: int = 1


@dataclass(frozen=True)
class Profile:
    """One profiled request.

    Attributes:
        package: the package folder.
        request: ``embed``, ``classify`` or ``generate``.
        total_ms: the request's wall time, as the caller saw it.
        stages: the breakdown, host stages and graph op types; they add up to ``total_ms``.
        runs: graph runs in the request (a generation: prefill, then one per new token).
        detail: what the request produced (``tokens`` generated, ``ttft_ms``, the ``label``).
        trace: a Chrome trace (``{"traceEvents": [...]}``) of the measured request.
    """

    package: str
    request: str
    total_ms: float
    stages: list[Stage]
    runs: int
    detail: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the trace left out: ``write_trace``)."""
        return {
            "package": self.package,
            "request": self.request,
            "total_ms": round(self.total_ms, 3),
            "runs": self.runs,
            "stages": [
                {"name": s.name, "ms": round(s.ms, 3), "calls": s.calls} for s in self.stages
            ],
            "detail": self.detail,
        }

    def write_trace(self, path: Path) -> None:
        """Write the Chrome trace as JSON to ``path``."""
        path.write_text(json.dumps(self.trace) + "\n", encoding="utf-8")


def profile(
    package: str | Path,
    *,
    text: str | None = None,
    prompt: str | None = None,
    image: str | Path | None = None,
    threads: int | None = None,
    max_new_tokens: int = 16,
    chat: bool = False,
) -> Profile:
    """Profile one request to ``package``: ``text`` (embed, classify), ``prompt`` (generate,
    greedy, ``max_new_tokens`` at most; with ``chat``, sent as a user message through the
    package's chat template) or ``image`` (an image file to classify).

    Raises:
        ConfigError: not exactly one input, or one the package's task does not take.
        InferenceError: onnxruntime wrote no profile.
    """
    from edgeinfer.runtime.model import load

    if sum(x is not None for x in (text, prompt, image)) != 1:
        raise ConfigError("profile one request: give exactly one of --text, --prompt, --image")
    with tempfile.TemporaryDirectory(prefix="edgeinfer-profile-") as tmp:
        folder = Path(tmp)
        model = load(
            package, config=RuntimeConfig(threads=threads, warmup_runs=0, profile_dir=folder)
        )
        try:
            task = model.task
            message = [{"role": "user", "content": prompt}] if chat and prompt else prompt
            request = _request(model, task, text, message, image, max_new_tokens)
            request()  # warm-up: allocation and kernel selection
            time.sleep(_GAP_S)
            before = model.metrics()
            started = time.time_ns()
            result = request()
            ended = time.time_ns()
            after = model.metrics()
        finally:
            model.close()
        del model, request  # the request's closure holds the model too
        gc.collect()  # the sessions write their profiles when freed
        events = _ort_events(folder, started - _MARGIN_NS, ended)
    total_ms = (ended - started) / 1e6
    host = _host_stages(task, before.latency_ms, after.latency_ms)
    stages, runs = _breakdown(events, host, total_ms)
    return Profile(
        package=str(package),
        request=task,
        total_ms=total_ms,
        stages=stages,
        runs=runs,
        detail=_detail(result),
        trace=_trace(events, host, started, total_ms),
    )


def _request(
    model: Any,
    task: str,
    text: str | None,
    prompt: Prompt | None,
    image: str | Path | None,
    max_new_tokens: int,
) -> Callable[[], Any]:
    if prompt is not None and task == "generate":
        return lambda: model.generate(prompt, max_new_tokens=max_new_tokens)
    if text is not None and task in ("embed", "classify"):
        return lambda: model.embed([text]) if task == "embed" else model.classify([text])
    if image is not None and task == "classify":
        return lambda: model.classify(str(image))
    given = "--text" if text is not None else "--prompt" if prompt is not None else "--image"
    wanted = {"generate": "--prompt", "embed": "--text"}.get(task, "--text or --image")
    raise ConfigError(f"{model.path} is a {task!r} package: profile it with {wanted}, not {given}")


def _ort_events(folder: Path, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """The profiler's complete events that began in [start_ns, end_ns], each with ``abs_ns``
    (its start on ``time.time_ns()``'s clock) and ``graph`` (the graph file's stem)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise InferenceError("onnxruntime wrote no profile; the package's sessions did not run")
    out = []
    for path in files:
        origin, _, rest = path.name.partition(".")
        graph = rest.rsplit("_", 3)[0]  # ORT appends _YYYY-MM-DD_HH-MM-SS_mmm.json
        for event in json.loads(path.read_text(encoding="utf-8")):
            if event.get("ph") != "X":
                continue
            at = int(origin) + int(event["ts"]) * 1000
            if start_ns <= at <= end_ns:
                out.append({**event, "abs_ns": at, "graph": graph})
    return sorted(out, key=lambda e: e["abs_ns"])


def _host_stages(
    task: str, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """The runtime's own stage times of the measured request (``model.metrics()``)."""
    out = {}
    for stage, summary in after.get(task, {}).items():
        earlier = before.get(task, {}).get(stage)
        out[stage] = summary.sum_ms - (earlier.sum_ms if earlier is not None else 0.0)
    return out


def _breakdown(
    events: list[dict[str, Any]], host: dict[str, float], total_ms: float
) -> tuple[list[Stage], int]:
    """Host stages and graph op types, adding up to ``total_ms``; and the graph run count."""
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    run_ms = sum(e["dur"] for e in runs) / 1e3
    ops: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ops.setdefault(e["args"].get("op_name", "?"), []).append(e["dur"] / 1e3)
    kernels_ms = sum(sum(t) for t in ops.values())
    stages = []
    if "tokenize" in host:
        stages.append(Stage("tokenize", host["tokenize"]))
    for op, times in sorted(ops.items(), key=lambda kv: -sum(kv[1])):
        stages.append(Stage(f"graph · {op}", sum(times), len(times)))
    stages.append(Stage("graph · runtime", max(0.0, run_ms - kernels_ms), len(runs)))
    if "compute" in host:  # the runtime's compute wraps the runs: padding, pooling, heads
        stages.append(Stage("pad + post-process", max(0.0, host["compute"] - run_ms)))
        rest, name = total_ms - host.get("tokenize", 0.0) - host["compute"], "other"
    else:
        rest, name = total_ms - run_ms, "host: pre/post-process"
    stages.append(Stage(name, max(0.0, rest)))
    return stages, len(runs)


def _detail(result: Any) -> dict[str, Any]:
    from edgeinfer.runtime.streaming import GenerationResult

    if isinstance(result, GenerationResult):
        return {
            "tokens": len(result.token_ids),
            "prompt_tokens": result.prompt_tokens,
            "ttft_ms": round(result.ttft_ms, 3),
            "text": result.text,
        }
    first = result[0] if isinstance(result, list) and result else result
    label = getattr(first, "label", None)
    return {"label": label} if label is not None else {}


def _trace(
    events: list[dict[str, Any]], host: dict[str, float], started_ns: int, total_ms: float
) -> dict[str, Any]:
    """The measured request as Chrome trace events (microseconds from its start): the request
    and its tokenize stage on one row, every graph run and kernel on its graph's row."""
    rows = {"request": 1}
    trace: list[dict[str, Any]] = [
        {"name": "request", "ph": "X", "ts": 0.0, "dur": total_ms * 1e3, "pid": 1, "tid": 1}
    ]
    if "tokenize" in host:
        trace.append(
            {
                "name": "tokenize",
                "ph": "X",
                "ts": 0.0,
                "dur": host["tokenize"] * 1e3,
                "pid": 1,
                "tid": 1,
            }
        )
    for e in events:
        if e.get("cat") not in ("Node", "Session"):
            continue
        tid = rows.setdefault(e["graph"], len(rows) + 1)
        name = e["name"].removesuffix("_kernel_time")
        args = {"op": e["args"]["op_name"]} if "op_name" in e.get("args", {}) else {}
        trace.append(
            {
                "name": name,
                "cat": e["cat"],
                "ph": "X",
                "ts": (e["abs_ns"] - started_ns) / 1e3,
                "dur": float(e["dur"]),
                "pid": 1,
                "tid": tid,
                "args": args,
            }
        )
    names = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": row}}
        for row, tid in rows.items()
    ]
    return {"traceEvents": names + trace, "displayTimeUnit": "ms"}
