"""Raw packages in the runtime: state carried per stream, streams forgotten on request and
beyond the bound, inputs checked before the graph runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ConfigError, InputError
from edgeinfer.runtime.kinds import raw

pytestmark = pytest.mark.slow  # the package is exported once per session

ONES = np.ones((1, 4), np.float32)


def test_each_stream_keeps_its_own_state(raw_package: Path) -> None:
    with edgeinfer.load(raw_package) as model:
        assert model.task == "raw"
        a = [model.run({"x": ONES}, stream="a")["out"][0, 0] for _ in range(3)]
        b = model.run({"x": ONES * 5}, stream="b")["out"][0, 0]
        assert a == [2, 4, 6] and b == 10
        assert model.run({"x": ONES}, stream="a")["out"][0, 0] == 8
        model.end_stream("a")
        assert model.run({"x": ONES}, stream="a")["out"][0, 0] == 2  # afresh
        state = np.full((1, 4), 10, np.float32)  # a caller may carry the state itself
        alone = model.run({"x": ONES, "state": state})
        assert alone["out"][0, 0] == 12 and alone["stateN"][0, 0] == 12


def test_streams_are_bounded(raw_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw, "MAX_STREAMS", 2)
    with edgeinfer.load(raw_package) as model:
        for name in ("a", "b", "a", "c"):  # c pushes out b, the least recently used
            model.run({"x": ONES}, stream=name)
        assert isinstance(model, raw.RawModel) and model.streams == 2
        assert model.run({"x": ONES}, stream="a")["out"][0, 0] == 6  # a was kept
        assert model.run({"x": ONES}, stream="b")["out"][0, 0] == 2  # b was forgotten


def test_bad_feeds_are_refused(raw_package: Path) -> None:
    with edgeinfer.load(raw_package) as model:
        with pytest.raises(InputError, match="has no inputs"):
            model.run({"y": ONES})
        with pytest.raises(InputError, match="needs the inputs"):
            model.run({})
        with pytest.raises(InputError, match="stream's state"):
            model.run({"x": ONES, "state": ONES}, stream="a")
        with pytest.raises(InputError, match="takes float32"):
            model.run({"x": np.ones((1, 4), np.int64)})
        with pytest.raises(ConfigError, match="has no embed"):
            model.embed("text")


def test_shapes_are_checked_against_the_graphs_own_dimensions() -> None:
    raw._check_shape("x", np.ones((1, 7)), (1, "width"))  # named: free
    raw._check_shape("x", np.ones((1, 7)), (1, 0))  # unnamed (ONNX dim_value 0): free
    with pytest.raises(InputError, match=r"input x takes shape \[1, 4\].*got \[1, 7\]"):
        raw._check_shape("x", np.ones((1, 7)), (1, 4))
