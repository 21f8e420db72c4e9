"""Run a classifier exported as segments and stop at the first exit head that is confident.

An early-exit package (``manifest.early_exit``) holds one ONNX graph per block of layers.
Segment 0 takes ``input_ids``/``attention_mask``/``token_type_ids``; every later one takes the
``hidden_states`` [B, S, D] of the one before (its ``hidden_states_out``) and the mask. Each
returns its exit ``logits`` [B, C] (mean pooling + linear); the last segment's exit is the
full-depth head. A text exits at the first head whose max softmax probability is >= the
threshold; the last head always answers.

Batch policy (see docs/early_exit.md): a text leaves the batch as soon as it exits, so later
segments run only on the texts still undecided (and on their longest length, not the batch's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError, ManifestError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import ClassificationResult, classification_results, softmax

__all__ = [
    "BatchPolicy",
    "ExitTrace",
    "SegmentRunner",
    "first_exit",
    "passes",
    "validate_threshold",
]

# "leave": a text leaves the batch when it exits; "all": the batch runs until every text exited.
BatchPolicy = Literal["leave", "all"]


def validate_threshold(threshold: float) -> float:
    """Return ``threshold`` as a float; raise ``ConfigError`` unless it is finite and >= 0.

    0 exits every text at the first head; anything above 1 never exits early."""
    value = float(threshold)
    if not math.isfinite(value) or value < 0.0:
        raise ConfigError(f"exit_threshold must be a finite number >= 0, got {threshold}")
    return value


def passes(logits: np.ndarray, threshold: float) -> np.ndarray:
    """Which rows of ``logits`` [B, C] are confident: max softmax probability >= threshold.

    Returns bool [B]."""
    confident: np.ndarray = softmax(logits.astype(np.float32)).max(axis=1) >= threshold
    return confident


def first_exit(exit_logits: Sequence[np.ndarray], threshold: float) -> np.ndarray:
    """The exit each row answers at: the first head that ``passes``, else the last one.

    exit_logits: one [B, C] array per exit, in depth order. Returns int64 [B] exit indices."""
    chosen = np.full(exit_logits[0].shape[0], len(exit_logits) - 1, dtype=np.int64)  # [B]
    undecided = np.ones_like(chosen, dtype=bool)
    for index, logits in enumerate(exit_logits[:-1]):
        now = undecided & passes(logits, threshold)
        chosen[now] = index
        undecided &= ~now
    return chosen


@dataclass(frozen=True)
class ExitTrace:
    """Every exit's logits for one batch run through all segments, and each segment's time.

    Attributes:
        logits: one float32 [B, C] array per exit, in depth order.
        segment_ms: wall time of each segment's run, in the same order.
    """

    logits: list[np.ndarray]
    segment_ms: list[float]


class SegmentRunner:
    """The segments of an early-exit package, loaded into one session each.

    Args:
        path: the package folder.
        manifest: its manifest (``early_exit`` must be set).
        providers: ORT provider names or aliases in order (default: the package's).
        config: thread and spin settings.
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        *,
        providers: Sequence[str] | None = None,
        config: RuntimeConfig,
    ) -> None:
        spec = manifest.early_exit
        if not spec or not spec.get("segments"):
            raise ManifestError(f"{path.name} has no early_exit segments in its manifest")
        requested = tuple(providers or ()) or tuple(manifest.providers)
        resolved = eps.resolve(requested)
        self.sessions = [
            GraphSession(path / segment["graph"], providers=resolved, config=config)
            for segment in spec["segments"]
        ]
        self.exit_layers: list[int] = [int(s["exit_layer"]) for s in spec["segments"]]
        self.labels: list[str] = list(manifest.io["labels"])
        self.default_threshold = validate_threshold(float(spec["threshold"]))
        self.providers = self.sessions[0].providers

    def _segment(
        self, index: int, state: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Run segment ``index``: (hidden [B, S, D] or None after the last, logits [B, C])."""
        feeds: dict[str, Any] = {"attention_mask": attention_mask}
        if index == 0:
            feeds.update(input_ids=state, token_type_ids=np.zeros_like(state))
        else:
            feeds["hidden_states"] = state
        outputs = self.sessions[index].run(feeds)
        if index == len(self.sessions) - 1:
            return None, outputs[-1]
        return outputs[0], outputs[1]

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        *,
        threshold: float,
        policy: BatchPolicy = "leave",
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run the segments on a padded batch until every row has exited.

        input_ids, attention_mask: [B, S] (right-padded). Returns the exit index of each row
        (int64 [B]) and the logits [B, C] of the head that answered it.
        """
        batch = input_ids.shape[0]
        exit_index = np.full(batch, -1, dtype=np.int64)  # [B]; -1: not exited yet
        answer: np.ndarray | None = None  # [B, C] once the first logits are known
        active = np.arange(batch)  # rows of the original batch still in the running batch
        state, mask = input_ids, attention_mask
        last = len(self.sessions) - 1
        for index in range(len(self.sessions)):
            hidden, logits = self._segment(index, state, mask)
            if answer is None:
                answer = np.zeros((batch, logits.shape[1]), dtype=np.float32)
            undecided = exit_index[active] < 0
            now = undecided & (passes(logits, threshold) if index < last else True)
            answer[active[now]] = logits[now]
            exit_index[active[now]] = index
            if hidden is None or bool((exit_index >= 0).all()):
                break  # the last segment ran, or every row has its answer
            if policy == "leave":
                keep = ~now & undecided  # [B'] rows still undecided
                active, mask = active[keep], mask[keep]
                length = int(mask.sum(axis=1).max())  # right padding: drop all-pad columns
                mask = np.ascontiguousarray(mask[:, :length])
                state = np.ascontiguousarray(hidden[keep, :length])
            else:
                state = hidden
        if answer is None:
            raise ManifestError("the package's early_exit field lists no segments")
        return exit_index, answer

    def classify(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        *,
        threshold: float | None = None,
        policy: BatchPolicy = "leave",
    ) -> list[ClassificationResult]:
        """One ``ClassificationResult`` per row, its ``exit_layer`` the layer that answered."""
        tau = self.default_threshold if threshold is None else validate_threshold(threshold)
        exit_index, logits = self.run(input_ids, attention_mask, threshold=tau, policy=policy)
        results = classification_results(logits, self.labels)
        return [
            ClassificationResult(
                label=r.label,
                score=r.score,
                scores=r.scores,
                exit_layer=self.exit_layers[int(i)],
            )
            for r, i in zip(results, exit_index, strict=True)
        ]

    def trace(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> ExitTrace:
        """Run every segment on the whole batch, timing each (threshold calibration, tests)."""
        state, exits, times = input_ids, [], []
        for index in range(len(self.sessions)):
            began = time.perf_counter()
            hidden, logits = self._segment(index, state, attention_mask)
            times.append((time.perf_counter() - began) * 1e3)
            exits.append(logits.astype(np.float32))
            if hidden is not None:
                state = hidden
        return ExitTrace(logits=exits, segment_ms=times)
