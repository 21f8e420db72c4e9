"""How a profiled request is shown: a Chrome trace (``chrome://tracing``, Perfetto) of its
events, and a flame-style PNG of its breakdown (widths are time; the request at the bottom, its
stages above it, the graph's op types above the graph).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from edgeinfer.errors import MissingDependencyError

__all__ = ["chrome_trace", "flame_png", "headline", "write_flame"]

# Graph stages are named "graph · <op type>" (and "graph · runtime").
_GRAPH = "graph · "
# About how many 7-point characters a row of the 10-inch, 110-dpi figure holds (~5.9 px each
# on ~900 px of axes), a little under so that labels stay inside their bars.
_ROW_CHARS = 150


def headline(request: str, total_ms: float, runs: int) -> str:
    """The one-line title of a profile, for its table and its flame PNG."""
    return f"{request} request: {total_ms:.2f} ms, {runs} graph run{'s' * (runs != 1)}"


def chrome_trace(
    events: list[dict[str, Any]],
    host: dict[str, float],
    spans: dict[str, tuple[int, int]],
    started_ns: int,
    total_ms: float,
) -> dict[str, Any]:
    """The measured request as Chrome trace events (microseconds from its start): the request,
    the bridge's decode and serialize spans and the tokenize stage on one row, every graph run
    and kernel on its graph's row."""
    rows = {"request": 1}
    trace: list[dict[str, Any]] = [
        {"name": "request", "ph": "X", "ts": 0.0, "dur": total_ms * 1e3, "pid": 1, "tid": 1}
    ]
    for name, (start, end) in spans.items():
        ts, dur = (start - started_ns) / 1e3, (end - start) / 1e3
        trace.append({"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": 1})
    if "tokenize" in host:  # it starts as the payload is decoded (or the call begins)
        decoded = spans.get("decode request", (started_ns, started_ns))[1]
        trace.append(
            {
                "name": "tokenize",
                "ph": "X",
                "ts": (decoded - started_ns) / 1e3,
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


def flame_png(profile: dict[str, Any]) -> bytes:
    """A flame-style PNG of ``profile`` (``Profile.to_dict()``): the request's bar at the
    bottom, its stages on the row above in order, the graph stages merged into one ``graph``
    bar with its op types above it; every width is the stage's time."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "bench") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = float(profile["total_ms"]) or 1e-9
    stages = [(s["name"], float(s["ms"])) for s in profile["stages"]]
    graph = [(name.removeprefix(_GRAPH), ms) for name, ms in stages if name.startswith(_GRAPH)]
    middle: list[tuple[str, float]] = []
    for name, ms in stages:
        if not name.startswith(_GRAPH):
            middle.append((name, ms))
        elif not middle or middle[-1][0] != "graph":
            middle.append(("graph", sum(t for _, t in graph)))
    fig, ax = plt.subplots(figsize=(10, 3.2))
    colors = plt.get_cmap("tab20")
    rows: list[list[tuple[str, float, float]]] = [[("request", 0.0, total)], [], []]
    at = 0.0
    for name, ms in middle:
        rows[1].append((name, at, ms))
        if name == "graph":
            inner = at
            for op, op_ms in graph:
                rows[2].append((op, inner, op_ms))
                inner += op_ms
        at += ms
    for level, row in enumerate(rows):
        for i, (name, start, width) in enumerate(row):
            color = colors((level * 7 + i) % colors.N)
            ax.barh(level, width, left=start, height=0.9, color=color, edgecolor="white")
            label = _fit(f"{name} {width:.2f} ms", name, width / total * _ROW_CHARS)
            if label:
                ax.text(start + width / 2, level, label, ha="center", va="center", fontsize=7)
    ax.set_yticks([0, 1, 2], ["request", "stages", "graph ops"])
    ax.set_xlim(0, max(total, at))
    ax.set_xlabel("milliseconds of the measured request")
    ax.set_title(headline(profile["request"], total, int(profile["runs"])))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def _fit(label: str, name: str, chars: float) -> str:
    """What of a box's label fits in ``chars`` characters, as flame graphs cut theirs: the
    whole label, the name alone, the name cut with an ellipsis, or nothing."""
    room = int(chars) - 1  # one character of margin, half on each side
    if len(label) <= room:
        return label
    if len(name) <= room:
        return name
    return name[: room - 1] + "…" if room >= 4 else ""


def write_flame(profile: dict[str, Any], path: Path) -> None:
    """Write ``flame_png(profile)`` to ``path``."""
    path.write_bytes(flame_png(profile))
