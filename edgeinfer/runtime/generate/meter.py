"""What the engine measured: inter-token gaps, queue waits and when each token came, kept for
a bounded window, summarized by ``Engine.stats``."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

__all__ = ["Meter"]

_WINDOW_S = 10.0  # tokens/s over the last 10 s


class Meter:
    """The engine thread's figures (appended there, read from any thread)."""

    def __init__(self) -> None:
        self._gaps: deque[float] = deque(maxlen=4096)  # ms between two tokens of a sequence
        self._waits: deque[float] = deque(maxlen=512)  # ms from submission to admission
        self._produced: deque[float] = deque(maxlen=4096)  # when each token came
        self.tokens = 0

    def token(self, times: list[float]) -> None:
        """A sequence's token came; ``times``: when each of its tokens came."""
        if len(times) > 1:
            self._gaps.append((times[-1] - times[-2]) * 1e3)
        self.tokens += 1
        self._produced.append(times[-1])

    def admitted(self, waited_s: float) -> None:
        """A sequence started after ``waited_s`` in the queue."""
        self._waits.append(waited_s * 1e3)

    def summary(self) -> dict[str, Any]:
        """Tokens, tokens/s over the last 10 s, inter-token p50/p99 and queue-wait p50 (ms)."""
        now = time.perf_counter()
        recent = sum(1 for t in list(self._produced) if now - t <= _WINDOW_S)
        # list(): one C-level copy each, taken whole while the engine's thread appends
        gaps, waits = np.array(list(self._gaps) or [0.0]), np.array(list(self._waits) or [0.0])
        return {
            "tokens": self.tokens,
            "tokens_per_s": round(recent / _WINDOW_S, 2),
            "inter_token_ms_p50": round(float(np.percentile(gaps, 50)), 3),
            "inter_token_ms_p99": round(float(np.percentile(gaps, 99)), 3),
            "queue_wait_ms_p50": round(float(np.percentile(waits, 50)), 3),
        }

    def clear(self) -> None:
        """Forget everything (after the warm-up)."""
        for kept in (self._gaps, self._waits, self._produced):
            kept.clear()
        self.tokens = 0
