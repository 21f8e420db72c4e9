"""Run a classifier exported as segments and stop at the first exit head that is confident.

An early-exit package (``manifest.early_exit``) holds one ONNX graph per block of layers. For
text, segment 0 takes ``input_ids``/``attention_mask``/``token_type_ids`` and every later one
the ``hidden_states`` [B, S, D] of the one before (its ``hidden_states_out``) and the mask; for
images (``early_exit.input == "image"``) segment 0 takes ``pixels`` [B, 1, H, W] and later ones
the feature map. Each returns its exit ``logits`` [B, C]; the last segment's exit is the
full-depth head, which always answers when no earlier one did.

Exit rules (``ExitPolicy``): ``max_softmax`` exits when the max softmax probability is >= the
threshold; ``entropy`` when the softmax entropy divided by log(C) is <= the threshold;
``patience`` (PABEE) when the same label has been predicted by ``threshold`` consecutive heads.

Batch policy (see docs/early_exit.md): a row leaves the batch as soon as it exits, so later
segments run only on the rows still undecided (texts: on their longest length, not the batch's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from edgeinfer import providers as eps
from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConfigError, InputError, ManifestError
from edgeinfer.manifest import Manifest
from edgeinfer.package_io import ExitSegmentsIO
from edgeinfer.runtime.session import GraphSession
from edgeinfer.runtime.tasks import ClassificationResult, classification_results

__all__ = [
    "EXIT_POLICIES",
    "BatchPolicy",
    "ExitPolicy",
    "ExitRule",
    "ExitTrace",
    "SegmentRunner",
    "exit_policy",
    "first_exit",
    "normalized_entropy",
    "passes",
    "validate_threshold",
]

# "leave": a row leaves the batch when it exits; "all": the batch runs until every row exited.
BatchPolicy = Literal["leave", "all"]
ExitPolicy = Literal["max_softmax", "entropy", "patience"]
EXIT_POLICIES: tuple[str, ...] = get_args(ExitPolicy)


def exit_policy(name: str) -> ExitPolicy:
    """``name`` as an exit rule, or ``ConfigError`` naming the rules there are."""
    for policy in get_args(ExitPolicy):
        if name == policy:
            return policy  # type: ignore[no-any-return]
    raise ConfigError(f"exit_policy must be one of {list(EXIT_POLICIES)}, got {name!r}")


def validate_threshold(threshold: float, policy: str = "max_softmax") -> float:
    """Return ``threshold`` as a float after checking it suits ``policy`` (``ConfigError``).

    max_softmax: finite and >= 0 (0: every row exits at the first head, > 1: none exits
    early). entropy: finite (>= 1: the first head, < 0: none early). patience: an integer
    >= 1 (1: the first head; more than the number of heads: none early)."""
    if policy not in EXIT_POLICIES:
        raise ConfigError(f"unknown exit policy {policy!r}: use {', '.join(EXIT_POLICIES)}")
    value = float(threshold)
    if not math.isfinite(value):
        raise ConfigError(f"exit_threshold must be finite, got {threshold}")
    if policy == "max_softmax" and value < 0.0:
        raise ConfigError(f"a max_softmax exit_threshold must be >= 0, got {threshold}")
    if policy == "patience" and (value < 1.0 or not value.is_integer()):
        raise ConfigError(f"a patience exit_threshold is a whole number of heads >= 1, got {value}")
    return value


def _shifted(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z = logits - row max [B, C], exp(z) [B, C] and its row sums [B] (float64)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return z, e, e.sum(axis=1)


def normalized_entropy(logits: np.ndarray) -> np.ndarray:
    """Softmax entropy of each row of ``logits`` [B, C] divided by log(C): float [B] in [0, 1].

    With p = exp(z) / S: H = log S - sum(exp(z) z) / S (no log of a tiny probability)."""
    z, e, total = _shifted(logits)
    entropy = np.log(total) - (e * z).sum(axis=1) / total  # [B]
    normalized: np.ndarray = np.clip(entropy / math.log(max(logits.shape[1], 2)), 0.0, 1.0)
    return normalized


def passes(logits: np.ndarray, threshold: float, policy: str = "max_softmax") -> np.ndarray:
    """Which rows of ``logits`` [B, C] are confident under a one-head rule (bool [B]):
    max softmax probability (1 / S, the max's z being 0) >= threshold, or normalized entropy
    <= threshold. Called once per head per call, so kept to a few vector operations."""
    if policy == "entropy":
        low: np.ndarray = normalized_entropy(logits) <= threshold
        return low
    confident: np.ndarray = 1.0 / _shifted(logits)[2] >= threshold
    return confident


class ExitRule:
    """One exit rule applied head after head to a batch; keeps the patience streaks.

    Args:
        policy: the rule.
        threshold: its threshold (validated by ``validate_threshold``).
        batch: rows in the original batch.
    """

    def __init__(self, policy: str, threshold: float, batch: int) -> None:
        self.policy, self.threshold = policy, validate_threshold(threshold, policy)
        self.label = np.full(batch, -1, dtype=np.int64)  # [B] the last head's label
        self.streak = np.zeros(batch, dtype=np.int64)  # [B] heads in a row that agreed

    def exits(self, logits: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether each row of ``logits`` [B', C] (original rows ``rows`` [B']) exits here."""
        if self.policy != "patience":
            return passes(logits, self.threshold, self.policy)
        labels = logits.argmax(axis=1)  # [B']
        same = labels == self.label[rows]
        self.streak[rows] = np.where(same, self.streak[rows] + 1, 1)
        self.label[rows] = labels
        done: np.ndarray = self.streak[rows] >= self.threshold
        return done


def first_exit(
    exit_logits: Sequence[np.ndarray], threshold: float, policy: str = "max_softmax"
) -> np.ndarray:
    """The exit each row answers at: the first head where ``policy`` exits, else the last.

    exit_logits: one [B, C] array per exit, in depth order. Returns int64 [B] exit indices."""
    batch = exit_logits[0].shape[0]
    rule, rows = ExitRule(policy, threshold, batch), np.arange(batch)
    chosen = np.full(batch, len(exit_logits) - 1, dtype=np.int64)  # [B]
    undecided = np.ones_like(chosen, dtype=bool)
    for index, logits in enumerate(exit_logits[:-1]):
        now = undecided & rule.exits(logits, rows)
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
        io = manifest.io_as(ExitSegmentsIO)
        spec = manifest.early_exit
        if not spec or len(spec.get("segments") or ()) != len(io.graphs):
            raise ManifestError(
                f"{path.name}: its early_exit field must list one segment per graph; re-export it"
            )
        requested = tuple(providers or ()) or tuple(manifest.providers)
        resolved = eps.resolve(requested)
        self.sessions = [
            GraphSession(path / graph, providers=resolved, config=config) for graph in io.graphs
        ]
        self.exit_layers: list[int] = [int(s["exit_layer"]) for s in spec["segments"]]
        self.labels: list[str] = list(io.labels)
        self.images = io.input == "image"
        self.image_shape: tuple[int, ...] = tuple(io.image_shape or ())
        self.default_policy: ExitPolicy = exit_policy(str(spec.get("policy", "max_softmax")))
        self.default_threshold = validate_threshold(float(spec["threshold"]), self.default_policy)
        self.providers = self.sessions[0].providers

    def check_rule(self, threshold: float | None, policy: ExitPolicy | None) -> None:
        """Refuse an exit rule this package cannot apply (``ConfigError``): an unknown policy,
        a threshold that does not suit it, or another policy without its threshold."""
        rule = policy or self.default_policy
        validate_threshold(self.default_threshold if threshold is None else threshold, rule)
        if threshold is None and rule != self.default_policy:
            raise ConfigError(f"pass exit_threshold with exit_policy={rule!r}")

    def _segment(
        self, index: int, state: np.ndarray, attention_mask: np.ndarray | None
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """Run segment ``index``: (hidden state or None after the last, logits [B, C])."""
        feeds: dict[str, Any] = {}
        if attention_mask is not None:
            feeds["attention_mask"] = attention_mask
        if index == 0 and self.images:
            feeds["pixels"] = state
        elif index == 0:
            feeds.update(input_ids=state, token_type_ids=np.zeros_like(state))
        else:
            feeds["hidden_states"] = state
        outputs = self.sessions[index].run(feeds)
        if index == len(self.sessions) - 1:
            return None, outputs[-1]
        return outputs[0], outputs[1]

    def run(
        self,
        inputs: np.ndarray,
        attention_mask: np.ndarray | None,
        *,
        threshold: float,
        policy: BatchPolicy = "leave",
        exit_policy: ExitPolicy = "max_softmax",
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run the segments on a batch until every row has exited.

        inputs: input_ids [B, S] (right-padded, with ``attention_mask`` [B, S]) or pixels
        [B, 1, H, W] (``attention_mask`` None). Returns the exit index of each row (int64
        [B]) and the logits [B, C] of the head that answered it.
        """
        batch = inputs.shape[0]
        rule = ExitRule(exit_policy, threshold, batch)
        exit_index = np.full(batch, -1, dtype=np.int64)  # [B]; -1: not exited yet
        answer: np.ndarray | None = None  # [B, C] once the first logits are known
        active = np.arange(batch)  # rows of the original batch still in the running batch
        state, mask = inputs, attention_mask
        last = len(self.sessions) - 1
        for index in range(len(self.sessions)):
            hidden, logits = self._segment(index, state, mask)
            if answer is None:
                answer = np.zeros((batch, logits.shape[1]), dtype=np.float32)
            undecided = exit_index[active] < 0
            now = undecided & (rule.exits(logits, active) if index < last else True)
            answer[active[now]] = logits[now]
            exit_index[active[now]] = index
            if hidden is None or bool((exit_index >= 0).all()):
                break  # the last segment ran, or every row has its answer
            if policy == "leave":
                keep = ~now & undecided  # [B'] rows still undecided
                active, state = active[keep], hidden[keep]
                if mask is not None:
                    mask = mask[keep]
                    length = int(mask.sum(axis=1).max())  # right padding: drop all-pad columns
                    mask = np.ascontiguousarray(mask[:, :length])
                    state = state[:, :length]
                state = np.ascontiguousarray(state)
            else:
                state = hidden
        if answer is None:
            raise ManifestError("the package's early_exit field lists no segments")
        return exit_index, answer

    def classify(
        self,
        inputs: np.ndarray,
        attention_mask: np.ndarray | None,
        *,
        threshold: float | None = None,
        policy: BatchPolicy = "leave",
        exit_policy: ExitPolicy | None = None,
    ) -> list[ClassificationResult]:
        """One ``ClassificationResult`` per row, its ``exit_layer`` the layer that answered.

        ``exit_policy`` None keeps the package's default rule; ``threshold`` None its default
        threshold (only when the rule is the default one: a threshold means one rule)."""
        rule = self.default_policy if exit_policy is None else exit_policy
        if threshold is None and rule != self.default_policy:
            raise ConfigError(
                f"the package's default threshold is for {self.default_policy!r}; "
                f"pass exit_threshold with exit_policy={rule!r}"
            )
        tau = self.default_threshold if threshold is None else threshold
        exit_index, logits = self.run(
            inputs, attention_mask, threshold=tau, policy=policy, exit_policy=rule
        )
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

    def check_images(self, images: Any) -> np.ndarray:
        """``images`` as float32 [N, *image_shape]: one image ([H, W] or [1, H, W]) or a batch
        ([N, H, W] or [N, 1, H, W]) of intensities in [0, 1]; ``InputError`` otherwise."""
        if not self.images:
            raise InputError("this early-exit package classifies texts, not image arrays")
        if not isinstance(images, np.ndarray):
            raise InputError(f"images must be a numpy array, got {type(images).__name__}")
        if not np.issubdtype(images.dtype, np.floating):
            raise InputError(
                f"images must be floating point intensities in [0, 1], got {images.dtype} "
                "(divide 8-bit pixels by 255)"
            )
        shape = self.image_shape
        if images.shape in (shape, shape[1:]):
            images = images.reshape(1, *shape)
        elif images.ndim == len(shape) and images.shape[1:] == shape[1:] and shape[0] == 1:
            images = images[:, None]
        if images.ndim != len(shape) + 1 or images.shape[1:] != shape or len(images) == 0:
            raise InputError(
                f"images must have shape [N, {', '.join(map(str, shape))}] (or one image "
                f"{list(shape)}), got {list(images.shape)}"
            )
        if not np.isfinite(images).all() or images.min() < 0.0 or images.max() > 1.0:
            raise InputError("image intensities must be finite and in [0, 1]")
        return np.ascontiguousarray(images, dtype=np.float32)

    def classify_images(
        self,
        images: Any,
        *,
        batch_size: int,
        threshold: float | None = None,
        exit_policy: ExitPolicy | None = None,
    ) -> list[ClassificationResult]:
        """Classify images (see ``check_images``) ``batch_size`` at a time; each result's
        ``compute_ms`` is the time of the segment runs that answered its batch."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        pixels = self.check_images(images)  # [N, *image_shape]
        results: list[ClassificationResult] = []
        for start in range(0, len(pixels), batch_size):
            began = time.perf_counter()
            chunk = self.classify(
                pixels[start : start + batch_size],
                None,
                threshold=threshold,
                exit_policy=exit_policy,
            )
            compute_ms = (time.perf_counter() - began) * 1e3
            results.extend(replace(r, compute_ms=compute_ms) for r in chunk)
        return results

    def trace(self, inputs: np.ndarray, attention_mask: np.ndarray | None) -> ExitTrace:
        """Run every segment on the whole batch, timing each (threshold calibration, tests)."""
        state, exits, times = inputs, [], []
        for index in range(len(self.sessions)):
            began = time.perf_counter()
            hidden, logits = self._segment(index, state, attention_mask)
            times.append((time.perf_counter() - began) * 1e3)
            exits.append(logits.astype(np.float32))
            if hidden is not None:
                state = hidden
        return ExitTrace(logits=exits, segment_ms=times)
