"""Fixtures of the export tests."""

from __future__ import annotations

from typing import Any

import pytest

from edgeinfer.export import speed


@pytest.fixture
def int8_measured_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed guard sees the quantized variant twice as slow as fp32: the real probes run,
    a fixed clock times them. Whether int8 IS slower depends on the CPU, and no test may; the
    guard's statistics are tested on fixed samples in test_speed.py."""
    real = speed.compare

    def compare(reference: Any, candidate: Any, **kwargs: Any) -> speed.SpeedComparison:
        def clock(run: Any) -> float:
            run()
            return 2.0 if run is candidate else 1.0

        return real(reference, candidate, clock=clock, pairs=4)

    monkeypatch.setattr(speed, "compare", compare)
