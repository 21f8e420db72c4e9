"""Where one request's time goes (``edgeinfer profile``): the runtime's own stage timings
(``model.metrics()``: tokenize, queue, compute) joined with onnxruntime's profiler (every kernel
of every graph run, grouped by op type), as a table, a Chrome trace (``chrome://tracing``,
Perfetto) and a flame-style PNG (``runtime.profile_views``).

By default the request is served the way ``edgeinfer serve`` serves it, minus the network: its
payload decoded by the bridge's protocol, run by the bridge's request runner, and the reply
encoded in the wire format (``wire``: JSON or MsgPack), so decoding and serialization are
stages of their own; ``wire=None`` calls the model directly.

The package is loaded with the profiler on and no warm-up; the request runs once to warm the
session (allocation, kernel selection), then, after a pause that keeps the two apart on the
profiler's clock, once more: that second run is the one reported. Beside each session's
profile file lies the time its profiler's clock started, on ``time.time_ns()``'s clock
(``runtime.session.mark_profile_start``), which places its events on the request's clock.
"""

from __future__ import annotations

import base64
import gc
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.bench.profile_views import chrome_trace
from edgeinfer.config import BatchConfig, RuntimeConfig
from edgeinfer.errors import ConfigError, InferenceError

if TYPE_CHECKING:
    from edgeinfer.runtime.generate.chat import Prompt

__all__ = ["WIRES", "Profile", "Stage", "profile"]

WIRES = ("json", "msgpack")
_IMAGE_FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png"}

# Between the warm-up request and the measured one.
_GAP_S = 0.3


@dataclass(frozen=True)
class Stage:
    """One line of the breakdown.

    Attributes:
        name: ``decode request``, ``tokenize``, ``queue``, ``graph · MatMul`` (an op type's
            kernels), ``graph · runtime`` (onnxruntime's own work between kernels),
            ``pad + post-process``, ``serialize reply (json)`` and ``other``.
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
        detail: what the request produced (``tokens`` generated, ``ttft_ms``, the ``label``,
            the reply's ``reply_bytes`` and ``wire``).
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

    def write_flame(self, path: Path) -> None:
        """Write a flame-style PNG of the breakdown to ``path`` (needs matplotlib)."""
        from edgeinfer.bench.profile_views import write_flame

        write_flame(self.to_dict(), path)


def profile(
    package: str | Path,
    *,
    text: str | None = None,
    prompt: str | None = None,
    image: str | Path | None = None,
    threads: int | None = None,
    max_new_tokens: int = 16,
    chat: bool = False,
    wire: str | None = "json",
    batching: bool = False,
) -> Profile:
    """Profile one request to ``package``: ``text`` (embed, classify), ``prompt`` (generate,
    greedy, ``max_new_tokens`` at most; with ``chat``, sent as a user message through the
    package's chat template) or ``image`` (an image file to classify).

    ``wire`` (``json``, ``msgpack``): serve the request as the MQTT bridge does, from its
    payload to its encoded reply; ``None``: call the model directly. ``batching``: load the
    model with the dynamic batcher (``BatchConfig()``), so the request waits in its queue.

    Raises:
        ConfigError: not exactly one input, one the package's task does not take, an image
            the bridge does not take (``wire``), or an unknown ``wire``.
        InferenceError: onnxruntime wrote no profile.
    """
    from edgeinfer.runtime.model import load

    if sum(x is not None for x in (text, prompt, image)) != 1:
        raise ConfigError("profile one request: give exactly one of --text, --prompt, --image")
    if wire is not None and wire not in WIRES:
        raise ConfigError(f"wire must be one of {list(WIRES)} (or none), got {wire!r}")
    with tempfile.TemporaryDirectory(prefix="edgeinfer-profile-") as tmp:
        folder = Path(tmp)
        model = load(
            package,
            config=RuntimeConfig(threads=threads, warmup_runs=0, profile_dir=folder),
            batching=BatchConfig() if batching else None,
        )
        try:
            task = model.task
            message = [{"role": "user", "content": prompt}] if chat and prompt else prompt
            spans: dict[str, tuple[int, int]] = {}
            asked = _Asked(text, message, image, max_new_tokens)
            request = _request(model, task, asked)  # checks the input fits the task
            if wire is not None:
                request = _served(model, task, asked, wire, spans)
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
        events = _ort_events(folder, started, ended)
    total_ms = (ended - started) / 1e6
    host = _host_stages(task, before.latency_ms, after.latency_ms)
    stages, runs = _breakdown(events, host, spans, total_ms)
    detail = _detail(result)
    if wire is not None:
        detail = {**detail, "wire": wire, "reply_bytes": result.reply_bytes}
    return Profile(
        package=str(package),
        request=task,
        total_ms=total_ms,
        stages=stages,
        runs=runs,
        detail=detail,
        trace=chrome_trace(events, host, spans, started, total_ms),
    )


@dataclass(frozen=True)
class _Asked:
    """The request to profile: one of ``text``, ``prompt``, ``image``."""

    text: str | None
    prompt: Prompt | None
    image: str | Path | None
    max_new_tokens: int


def _request(model: Any, task: str, asked: _Asked) -> Callable[[], Any]:
    """The request as a direct call of the model."""
    text, prompt, image = asked.text, asked.prompt, asked.image
    if prompt is not None and task == "generate":
        return lambda: model.generate(prompt, max_new_tokens=asked.max_new_tokens)
    if text is not None and task in ("embed", "classify"):
        return lambda: model.embed([text]) if task == "embed" else model.classify([text])
    if image is not None and task == "classify":
        return lambda: model.classify(str(image))
    given = "--text" if text is not None else "--prompt" if prompt is not None else "--image"
    wanted = {"generate": "--prompt", "embed": "--text"}.get(task, "--text or --image")
    raise ConfigError(f"{model.path} is a {task!r} package: profile it with {wanted}, not {given}")


@dataclass(frozen=True)
class _Reply:
    """A request served as the bridge serves it: what the model answered (a
    ``GenerationResult``, or the reply's ``result`` value) and the encoded reply's size."""

    result: Any
    reply_bytes: int


def _served(
    model: Any, task: str, asked: _Asked, wire: str, spans: dict[str, tuple[int, int]]
) -> Callable[[], _Reply]:
    """The request as ``edgeinfer serve`` serves it: its payload decoded by the bridge's
    protocol, run by the bridge's runner, its reply encoded in ``wire``. ``spans`` gets the
    decode and encode spans of the latest call (``time.time_ns()``)."""
    from edgeinfer.bridge.serve import serving
    from edgeinfer.bridge.wire import kinds
    from edgeinfer.bridge.wire import protocol as proto

    data: dict[str, Any] = {"id": "profile", "reply_to": "profile/reply"}
    if asked.text is not None:
        data["text"] = asked.text
    elif asked.image is not None:
        path = Path(asked.image)
        fmt = _IMAGE_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ConfigError(
                f"the bridge takes JPEG or PNG images, not {path.name}: "
                "convert it, or profile the model directly (--wire none)"
            )
        blob = path.read_bytes()
        data["image"] = {
            "format": fmt,
            "data": blob if wire == "msgpack" else base64.b64encode(blob).decode("ascii"),
        }
    elif isinstance(asked.prompt, str):
        data.update(prompt=asked.prompt, max_new_tokens=asked.max_new_tokens)
    elif asked.prompt is not None:
        data.update(messages=list(asked.prompt), max_new_tokens=asked.max_new_tokens)
    payload = proto.encode(data, fmt=wire)
    content_type = proto.CONTENT_MSGPACK if wire == "msgpack" else None
    streams = serving.StreamTable()

    def serve() -> _Reply:
        t0 = time.time_ns()
        request = proto.decode_request(
            payload,
            model=task,
            content_type=content_type,
            max_payload_bytes=len(payload),
            received_ms=t0 / 1e6,
        )
        if isinstance(request, proto.ErrorReply):
            raise ConfigError(f"the bridge refuses this request: {request.message}")
        t1 = time.time_ns()
        given = request.input
        result: Any
        if isinstance(given, kinds.GenerateInput):
            prompt = given.prompt if isinstance(given.prompt, str) else list(given.prompt)
            result = model.generate(prompt, max_new_tokens=given.max_new_tokens)
            body = proto.Body(
                {  # the fields of the bridge's last generation reply
                    "text": result.text,
                    "completion_tokens": len(result.token_ids),
                    "ttft_ms": round(result.ttft_ms, 3),
                    "tokens_per_s": round(result.decode_tokens_per_s, 3),
                    "stop_reason": result.finish_reason,
                }
            )
        else:
            body = serving.run_request(task, model, request, streams).body
            result = body.value
        t2 = time.time_ns()
        head = {"v": proto.PROTOCOL_VERSION, "id": request.id, "ok": True, "model": task}
        reply = proto.encode_reply(head, body, fmt=wire)
        spans["decode request"] = (t0, t1)
        spans[f"serialize reply ({wire})"] = (t2, time.time_ns())
        return _Reply(result, len(reply))

    return serve


def _ort_events(folder: Path, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """The profiler's complete events that began in [start_ns, end_ns], each with ``abs_ns``
    (its start on ``time.time_ns()``'s clock) and ``graph`` (the graph file's stem)."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise InferenceError("onnxruntime wrote no profile; the package's sessions did not run")
    out = []
    for path in files:
        prefix = path.name.rsplit("_", 3)[0]  # ORT appends _YYYY-MM-DD_HH-MM-SS_mmm.json
        graph = prefix.partition(".")[2]
        origin = (folder / f"{prefix}.start").read_text(encoding="utf-8")
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
    events: list[dict[str, Any]],
    host: dict[str, float],
    spans: dict[str, tuple[int, int]],
    total_ms: float,
) -> tuple[list[Stage], int]:
    """Host stages, the bridge's ``spans`` and graph op types, adding up to ``total_ms``; and
    the graph run count."""
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    run_ms = sum(e["dur"] for e in runs) / 1e3
    ops: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ops.setdefault(e["args"].get("op_name", "?"), []).append(e["dur"] / 1e3)
    kernels_ms = sum(sum(t) for t in ops.values())
    span_ms = {name: (end - start) / 1e6 for name, (start, end) in spans.items()}
    stages = [Stage(span, ms) for span, ms in span_ms.items() if span.startswith("decode")]
    stages += [Stage(name, host[name]) for name in ("tokenize", "queue") if name in host]
    for op, times in sorted(ops.items(), key=lambda kv: -sum(kv[1])):
        stages.append(Stage(f"graph · {op}", sum(times), len(times)))
    stages.append(Stage("graph · runtime", max(0.0, run_ms - kernels_ms), len(runs)))
    rest = total_ms - sum(span_ms.values())
    if "compute" in host:  # the runtime's compute wraps the runs: padding, pooling, heads
        stages.append(Stage("pad + post-process", max(0.0, host["compute"] - run_ms)))
        rest -= host.get("tokenize", 0.0) + host.get("queue", 0.0) + host["compute"]
        name = "other"
    else:
        rest, name = rest - run_ms, "host: pre/post-process"
    stages += [Stage(span, ms) for span, ms in span_ms.items() if span.startswith("serialize")]
    stages.append(Stage(name, max(0.0, rest)))
    return stages, len(runs)


def _detail(result: Any) -> dict[str, Any]:
    from edgeinfer.runtime.generate.streaming import GenerationResult

    if isinstance(result, _Reply):
        return _detail(result.result)
    if isinstance(result, GenerationResult):
        return {
            "tokens": len(result.token_ids),
            "prompt_tokens": result.prompt_tokens,
            "ttft_ms": round(result.ttft_ms, 3),
            "text": result.text,
        }
    first = result[0] if isinstance(result, list) and result else result
    label = first.get("label") if isinstance(first, dict) else getattr(first, "label", None)
    return {"label": label} if label is not None else {}
