"""Which execution provider runs which part of a graph: a placement report and its gate.

An accelerator's execution provider takes the nodes it supports and leaves the rest to the CPU,
silently. This module asks onnxruntime itself: a session created with the session config entry
``session.record_ep_graph_assignment_info`` keeps, per provider, the subgraphs it was assigned
and the nodes inside them (``InferenceSession.get_provider_graph_assignment_info()``; in
onnxruntime 1.24 and later). Nodes are counted as onnxruntime partitions them: after its basic,
provider-independent optimizations and before the CPU-only fusions (which the report's sessions
skip, so counts compare across provider lists).

The FLOPs share is an estimate. One CPU-only run on dummy inputs with onnxruntime's profiler on
records every node's input and output shapes; matrix products and convolutions count
``2 x output elements x reduction length`` (the reduction length from the weight's shape), every
other node one operation per output element. Each assigned node takes the estimate of the node
with the same name in that run; nodes without a name there count zero (``unmatched_nodes``).
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError, EpCoverageError, InferenceError, ProviderError
from edgeinfer.providers import CPU, available, install_hint, to_ort_name

__all__ = ["PlacementReport", "ProviderShare", "check_coverage", "gate", "placement"]

log = logging.getLogger(__name__)

_RECORD_KEY = "session.record_ep_graph_assignment_info"
# Ops whose cost is a matrix product (activation first) or a convolution (weight index).
_MATMUL_OPS = frozenset(
    {
        "MatMul",
        "MatMulInteger",
        "MatMulNBits",
        "QLinearMatMul",
        "FusedMatMul",
        "DynamicQuantizeMatMul",
    }
)
_GEMM_OPS = frozenset({"Gemm", "QGemm"})
_CONV_WEIGHT_INDEX = {"Conv": 1, "ConvInteger": 1, "FusedConv": 1, "QLinearConv": 3}
_ATTENTION_OPS = frozenset({"Attention", "QAttention"})
# Dummy sizes for symbolic dims: one sequence of 16 tokens, no past (a decoder's prefill).
_BATCH, _SEQUENCE, _PAST = 1, 16, 0


@dataclass(frozen=True)
class ProviderShare:
    """What one execution provider takes: nodes, subgraphs, estimated FLOPs, op types."""

    provider: str
    nodes: int
    subgraphs: int
    flops: float
    op_types: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PlacementReport:
    """Where onnxruntime placed every node of a package's graphs for ``providers``.

    ``providers`` is the session's provider list (requested order, CPU last); ``shares`` holds
    one entry per provider in that order, also for providers that took nothing.
    """

    graphs: tuple[str, ...]
    providers: tuple[str, ...]
    shares: tuple[ProviderShare, ...]
    unmatched_nodes: int
    onnxruntime_version: str

    @property
    def total_nodes(self) -> int:
        """Nodes of every graph, over all providers."""
        return sum(s.nodes for s in self.shares)

    @property
    def total_flops(self) -> float:
        """Estimated FLOPs of one run on the dummy inputs, over all providers."""
        return sum(s.flops for s in self.shares)

    def share(self, provider: str) -> ProviderShare:
        """The share of ``provider`` (alias or ORT name); zero when it took nothing."""
        name = to_ort_name(provider)
        for entry in self.shares:
            if entry.provider == name:
                return entry
        return ProviderShare(provider=name, nodes=0, subgraphs=0, flops=0.0)

    def coverage(self, provider: str) -> float:
        """The fraction of the estimated FLOPs that ``provider`` takes (of nodes when the
        graphs have no FLOPs to estimate)."""
        entry = self.share(provider)
        if self.total_flops > 0:
            return entry.flops / self.total_flops
        return entry.nodes / self.total_nodes if self.total_nodes else 0.0

    def node_coverage(self, provider: str) -> float:
        """The fraction of the nodes that ``provider`` takes."""
        return self.share(provider).nodes / self.total_nodes if self.total_nodes else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, with each provider's node and FLOPs fractions."""
        return {
            "graphs": list(self.graphs),
            "providers": list(self.providers),
            "onnxruntime": self.onnxruntime_version,
            "total_nodes": self.total_nodes,
            "total_flops": self.total_flops,
            "unmatched_nodes": self.unmatched_nodes,
            "shares": [
                {
                    "provider": s.provider,
                    "nodes": s.nodes,
                    "subgraphs": s.subgraphs,
                    "flops": s.flops,
                    "node_coverage": round(self.node_coverage(s.provider), 4),
                    "coverage": round(self.coverage(s.provider), 4),
                    "op_types": dict(sorted(s.op_types.items())),
                }
                for s in self.shares
            ],
        }


def placement(
    path: Path,
    *,
    providers: Sequence[str],
    provider_options: Mapping[str, Mapping[str, str]] | None = None,
) -> PlacementReport:
    """Report how onnxruntime places the graphs of ``path`` on ``providers``.

    Args:
        path: a package folder (every ``.onnx`` file its manifest lists) or one ``.onnx`` file.
        providers: aliases or ORT names in order of preference; CPU is added last.
        provider_options: per provider (alias or ORT name), its onnxruntime options.

    Raises:
        ProviderError: a requested provider is not in this onnxruntime build (the message says
            which package brings it).
        ConfigError: ``path`` holds no graph, or this onnxruntime cannot report placement.
    """
    import onnxruntime as ort

    names = _providers(providers)
    options = {to_ort_name(k): dict(v) for k, v in (provider_options or {}).items()}
    graphs = _graphs(path)
    counts: dict[str, Counter[str]] = {n: Counter() for n in names}
    subgraphs: Counter[str] = Counter()
    flops: dict[str, float] = {}
    unmatched = 0
    for graph in graphs:
        estimate = _flops_by_node(graph)
        for ep_name, nodes in _assignment(graph, names, options):
            subgraphs[ep_name] += 1
            counts.setdefault(ep_name, Counter())
            for name, op_type in nodes:
                counts[ep_name][op_type] += 1
                if name in estimate:
                    flops[ep_name] = flops.get(ep_name, 0.0) + estimate[name]
                else:
                    unmatched += 1
    shares = tuple(
        ProviderShare(
            provider=ep,
            nodes=sum(ops.values()),
            subgraphs=subgraphs[ep],
            flops=flops.get(ep, 0.0),
            op_types=dict(ops),
        )
        for ep, ops in counts.items()
    )
    return PlacementReport(
        graphs=tuple(g.name for g in graphs),
        providers=tuple(names),
        shares=shares,
        unmatched_nodes=unmatched,
        onnxruntime_version=ort.__version__,
    )


def gate(package: Path, *, providers: Sequence[str], min_coverage: float) -> PlacementReport:
    """The export's coverage gate: place ``package`` on ``providers`` and raise
    ``EpCoverageError`` when the first one takes less than ``min_coverage`` of the FLOPs."""
    report = placement(package, providers=providers)
    check_coverage(report, min_coverage=min_coverage)
    return report


def check_coverage(report: PlacementReport, *, min_coverage: float) -> None:
    """Raise ``EpCoverageError`` when the first (accelerator) provider of ``report`` takes less
    than ``min_coverage`` of the estimated FLOPs."""
    first = report.providers[0]
    got = report.coverage(first)
    if got < min_coverage:
        cpu = report.coverage(CPU) if first != CPU else None
        raise EpCoverageError(
            provider=first, coverage=got, min_coverage=min_coverage, cpu_coverage=cpu
        )
    log.info(
        "%s takes %.1f %% of the estimated FLOPs (gate %.1f %%)",
        first,
        got * 100,
        min_coverage * 100,
    )


def _providers(requested: Sequence[str]) -> list[str]:
    """ORT names in order, CPU last; an unavailable provider is an error here, not a fallback:
    a placement on a provider that is not there would report the CPU's."""
    if not requested:
        raise ConfigError("give at least one execution provider (e.g. openvino,cpu)")
    have = set(available())
    names: list[str] = []
    for name in (to_ort_name(p) for p in requested):
        if name not in have:
            raise ProviderError(
                f"{name} is not in this onnxruntime build (have: {sorted(have)}); "
                f"{install_hint(name)}"
            )
        if name not in names:
            names.append(name)
    if CPU not in names:
        names.append(CPU)
    return names


def _graphs(path: Path) -> list[Path]:
    """The ``.onnx`` files of a package (as its manifest lists them) or the file itself."""
    if path.is_file() and path.suffix == ".onnx":
        return [path]
    if path.is_dir():
        from edgeinfer.manifest import Manifest

        manifest = Manifest.read(path)
        graphs = [path / name for name in sorted(manifest.files) if name.endswith(".onnx")]
        if graphs:
            return graphs
    raise ConfigError(f"{path} is neither a package with .onnx graphs nor an .onnx file")


def _session_options(*, record: bool, profile_dir: str | None = None) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    # Basic (provider-independent) optimizations only: partitioning happens after these, and
    # both sessions of a report must see the same node names.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    so.intra_op_num_threads = 1  # one tiny run: a thread pool would cost more than it saves
    if record:
        so.add_session_config_entry(_RECORD_KEY, "1")
    if profile_dir is not None:
        # Pre-packed weights drop out of the profiler's input shapes, and the estimate needs them.
        so.add_session_config_entry("session.disable_prepacking", "1")
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(profile_dir) / "placement")
    return so


def _assignment(
    graph: Path, names: list[str], options: Mapping[str, Mapping[str, str]]
) -> list[tuple[str, list[tuple[str, str]]]]:
    """ORT's own record: per assigned subgraph, its provider and (node name, op type) pairs."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(
            str(graph),
            sess_options=_session_options(record=True),
            providers=names,
            provider_options=[dict(options.get(n, {})) for n in names],
        )
    except Exception as exc:  # ORT raises its own pybind classes, not a public hierarchy
        raise InferenceError(f"onnxruntime could not load {graph.name} on {names}: {exc}") from exc
    dropped = [n for n in names if n not in session.get_providers()]
    if dropped:  # e.g. a plugin EP named in providers= instead of added for its devices
        log.warning("onnxruntime created %s without %s: they take nothing", graph.name, dropped)
    if not hasattr(session, "get_provider_graph_assignment_info"):
        raise ConfigError(
            f"onnxruntime {ort.__version__} cannot report node placement; "
            "upgrade it: pip install 'onnxruntime>=1.24'"
        )
    return [
        (sub.ep_name, [(node.name, node.op_type) for node in sub.get_nodes()])
        for sub in session.get_provider_graph_assignment_info()
    ]


def _flops_by_node(graph: Path) -> dict[str, float]:
    """Estimated FLOPs per node name from one profiled CPU run on dummy inputs."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="edgeinfer-placement-") as tmp:
        try:
            session = ort.InferenceSession(
                str(graph),
                sess_options=_session_options(record=False, profile_dir=tmp),
                providers=[CPU],
            )
            session.run(None, _dummy_feeds(session.get_inputs()))
            events = json.loads(Path(session.end_profiling()).read_text())
        except Exception as exc:  # ORT raises its own pybind classes, not a public hierarchy
            raise InferenceError(
                f"the FLOPs estimate could not run {graph.name} on dummy inputs: {exc}"
            ) from exc
    estimate: dict[str, float] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        node = event["name"].removesuffix("_kernel_time")
        estimate[node] = estimate.get(node, 0.0) + _node_flops(event["args"])
    return estimate


def _dummy_feeds(inputs: Sequence[Any]) -> dict[str, np.ndarray]:
    """Ones of each input's dtype and shape; symbolic dims get batch 1, past 0, else 16."""
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = [_dim(d) for d in spec.shape]
        dtype = _ORT_DTYPES.get(spec.type)
        if dtype is None:
            raise InferenceError(
                f"input {spec.name} has a type the estimate cannot feed: {spec.type}"
            )
        feeds[spec.name] = np.ones(shape, dtype=dtype)
    return feeds


def _dim(dim: Any) -> int:
    if isinstance(dim, int):
        return dim
    label = str(dim).lower()
    if "batch" in label:
        return _BATCH
    return _PAST if "past" in label else _SEQUENCE


_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _shapes(entries: Any) -> list[list[int]]:
    """Shapes from the profiler's ``[{dtype: shape}, ...]`` lists."""
    return [list(next(iter(e.values()))) for e in entries or [] if e]


def _node_flops(args: Mapping[str, Any]) -> float:
    """2 x output elements x reduction length for matrix products and convolutions; one op per
    output element otherwise."""
    op = args.get("op_name", "")
    inputs = _shapes(args.get("input_type_shape"))
    outputs = _shapes(args.get("output_type_shape"))
    out_elems = float(sum(math.prod(s) for s in outputs))
    if not outputs or not inputs:
        return out_elems
    out = outputs[0]
    if op in _MATMUL_OPS and inputs[0]:
        return 2.0 * math.prod(out) * inputs[0][-1]
    if op in _GEMM_OPS and len(inputs) > 1 and out:
        return 2.0 * math.prod(out) * math.prod(inputs[1]) / out[-1]
    index = _CONV_WEIGHT_INDEX.get(op)
    if index is not None and len(inputs) > index and inputs[index]:
        weight = inputs[index]
        return 2.0 * math.prod(out) * math.prod(weight) / weight[0]
    if op in _ATTENTION_OPS and len(inputs) > 1 and len(inputs[0]) == 3:
        batch, seq, hidden = inputs[0]
        projection = 2.0 * batch * seq * math.prod(inputs[1])
        return projection + 4.0 * batch * seq * seq * hidden  # QK^T and attention x V
    return out_elems
