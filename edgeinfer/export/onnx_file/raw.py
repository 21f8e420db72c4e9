"""The ``raw`` form of a user's graph: named tensors in and out, the state of a stateful graph
carried per stream, each output judged by its own metric (``export/gates``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.data import tensors
from edgeinfer.export.gates.choice import Choice, choose, judge
from edgeinfer.export.gates.declared import parse_declared
from edgeinfer.export.gates.verdict import Verdict
from edgeinfer.export.onnx_file.forms import Form
from edgeinfer.export.onnx_file.user_graph import state_pairs
from edgeinfer.package_io import PackageIO, RawIO, StateSpec
from edgeinfer.runtime import Model, RawModel
from edgeinfer.runtime.model import narrow

__all__ = ["RawForm"]

# Calls of tensor data calibrated on at most: MinMax ranges settle long before.
_MAX_CALIBRATION_CALLS = 4096


class RawForm(Form):
    """Any graph: named tensors in and out; the state of a stateful graph per stream."""

    def load(self) -> None:
        opts = self.run.options
        self.pairs = self._pairs()
        state = {name for name, _ in self.pairs}
        user = self._user_calibration()
        stateful = bool(self.pairs)
        own = tensors.read_streams(user, self.inputs, stateful=stateful) if user else None
        if opts.eval_data:
            self.held = tensors.read_streams(opts.eval_data, self.inputs, stateful=stateful)
        elif own is not None:
            own, self.held = tensors.split_held(own)
            self.eval_name = f"{user} (held part)"
        else:
            raise ConfigError(
                "a raw export is checked on your inputs: pass --eval-data FILE.npz|DIR (and "
                "--calibration for int8-static), one array per input name (docs/onnx.md)"
            )
        self.calibration = own or []
        for stream in [*self.held, *self.calibration]:
            for call in stream:
                if state & set(call):
                    raise ConfigError(
                        f"the data holds state inputs {sorted(state & set(call))}: leave them "
                        "out, every stream's state starts as zeros"
                    )
        self.state = self._measure_state()
        self.eval_name += f" ({tensors.describe(self.held)['calls']} calls)"

    def _pairs(self) -> list[tuple[str, str]]:
        recipe = self.run.source.recipe
        given = self.options.state or (tuple(recipe.onnx.get("state", ())) if recipe else ())
        return state_pairs(self.inputs, self.outputs, given)

    def _zeros(self) -> dict[str, np.ndarray]:
        shapes = {s.name: s for s in self.inputs}
        out = {}
        for name, _ in self.pairs:
            spec = shapes[name]
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.shape]
            out[name] = np.zeros(shape, np.dtype(spec.dtype))
        return out

    def _measure_state(self) -> tuple[StateSpec, ...]:
        """Each state's shape, as the graph returns it on the first held call."""
        if not self.pairs:
            return ()
        import onnxruntime

        graph = self.run.source.path / str(self.run.source.onnx_file)
        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        first = session.run(None, {**self.held[0][0], **self._zeros()})
        values = dict(zip(names, first, strict=True))
        return tuple(
            StateSpec(input=i, output=o, dtype=str(values[o].dtype), shape=tuple(values[o].shape))
            for i, o in self.pairs
        )

    def io(self, graph: Path) -> PackageIO:
        inputs, outputs = package.read_io(graph)
        return RawIO(graph=package.GRAPH_NAME, inputs=inputs, outputs=outputs, state=self.state)

    def evaluate(self, model: Model) -> list[dict[str, np.ndarray]]:
        """Every held call's outputs, state outputs included, call by call (shapes may differ
        between calls): each stream's state starts as zeros and is carried as the runtime's
        streams carry it."""
        outputs: list[dict[str, np.ndarray]] = []
        for stream in self.held:
            state = {s.input: np.zeros(s.shape, np.dtype(s.dtype)) for s in self.state}
            for call in stream:
                outputs.append(narrow(model, RawModel).run({**call, **state}))
                state = {i: outputs[-1][o] for i, o in self.pairs}
        return outputs

    def choices(self, reference: list[dict[str, np.ndarray]]) -> tuple[Choice, ...]:
        """Each output's metric (chosen once, on fp32's first held call)."""
        if not hasattr(self, "_choices"):
            self._choices = choose(
                kind="raw",
                feeds=self.held[0][0],
                reference=reference[0],
                state={o: i for i, o in self.pairs},
                declared=parse_declared(self.options.metrics),
            )
        return self._choices

    def score(self, reference: Any, candidate: Any) -> tuple[Verdict, dict[str, Any], str]:
        calls = [call for stream in self.held for call in stream]
        verdict = judge(
            self.choices(reference), feeds=calls, reference=reference, candidate=candidate
        )
        return verdict, {}, f"{len(calls)} held calls"

    def calibration_feeds(self, graph: Path, staged: Path) -> list[dict[str, np.ndarray]]:
        """Every calibration call with the state the graph really had there (run in fp32)."""
        if not self.calibration:
            raise ConfigError("int8-static needs --calibration data (tensors, docs/onnx.md)")
        import onnxruntime

        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds = []
        for stream in self.calibration:
            state = self._zeros()
            for call in stream:
                feed = {**call, **state}
                feeds.append(feed)
                values = dict(zip(names, session.run(None, feed), strict=True))
                state = {i: values[o] for i, o in self.pairs}
        return feeds[:_MAX_CALIBRATION_CALLS]

    def probe(self, model: Model) -> Callable[[], object]:
        calls, raw = self.held[0][:8], narrow(model, RawModel)

        def run() -> object:
            outputs = [raw.run(call, stream="probe") for call in calls]
            raw.end_stream("probe")
            return outputs

        return run

    def smoke_inputs(self) -> list[Any]:
        return [call for stream in self.held for call in stream][:3]
