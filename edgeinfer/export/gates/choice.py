"""Which metric judges each output, and the verdict on a candidate.

An output's metric is the one declared (``--metric OUTPUT=METRIC``), else the first that fits,
read from the package kind, the graph's inputs and fp32's outputs on the first held call:

1. ``state``: the output is carried into the next call (a stateful graph's state);
2. ``exact``: an integer or boolean output (ids, labels, flags);
3. ``detections``: a YOLO-style output of an image graph (or of a detector package);
4. ``sequence``: per-step class scores [1, T, C] (or time-major [T, 1, C]) of an image
   graph with C >= T (a text recognizer's alphabet outnumbers its steps; a detector head's
   anchors outnumber its classes: declare ``OUT=sequence`` for a recognizer with a small
   alphabet);
5. ``probabilities``: every row in [0, 1], summing to 1 (the graph ends in a softmax);
6. ``embedding``: token states [B, S, D] of a graph with a mask input of shape [B, S]
   (masked mean pooling, then cosine);
7. ``tensor``: anything else, a per-channel normalized error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgeinfer.errors import ConfigError
from edgeinfer.export.gates import tensors
from edgeinfer.export.gates.detections import detections, looks_like_detections
from edgeinfer.export.gates.embeddings import embeddings
from edgeinfer.export.gates.probabilities import looks_like_probabilities, probabilities
from edgeinfer.export.gates.sequences import sequences
from edgeinfer.export.gates.state import state
from edgeinfer.export.gates.verdict import OutputScore, Sample, Verdict
from edgeinfer.runtime.kinds.detect import DecodeConfig

__all__ = ["Choice", "choose", "judge"]

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Choice:
    """The metric that judges ``output``, why, and its parameters (the CTC blank of a
    sequence, the mask input of an embedding)."""

    output: str
    metric: str
    reason: str
    blank: int = 0
    mask: str | None = None


def _image_input(feeds: Feeds) -> str | None:
    """The graph's image input: a float [N, 1|3, H, W] tensor with H, W > 1 that is not a
    mask (a transformer's float attention mask [B, 1, 1, S] is none)."""
    for name, value in feeds.items():
        if value.dtype.kind == "f" and value.ndim == 4 and value.shape[1] in (1, 3):
            if min(value.shape[2:]) > 1 and "mask" not in name.lower():
                return name
    return None


def _mask_input(feeds: Feeds, value: np.ndarray) -> str | None:
    """A mask input matching token states [B, S, D]: [B, S], or broadcast as a transformer
    takes it ([B, 1, 1, S], 1/0 or additive 0/-inf)."""
    if value.ndim != 3:
        return None
    batch, steps = value.shape[:2]
    for name, fed in feeds.items():
        if "mask" not in name.lower() or fed.size != batch * steps:
            continue
        if fed.shape == value.shape[:2] or (fed.shape[0] == batch and fed.shape[-1] == steps):
            return name
    return None


def _auto(name: str, value: np.ndarray, feeds: Feeds, kind: str, state_of: str | None) -> Choice:
    image = _image_input(feeds)
    shape = list(value.shape)
    if state_of is not None:
        return Choice(name, "state", f"carried into the next call as state input {state_of}")
    if value.dtype.kind not in "fc":
        return Choice(name, "exact", f"a {value.dtype} output: its values agree or not")
    if looks_like_detections(value) and (image is not None or kind == "image-detector"):
        return Choice(
            name,
            "detections",
            f"a YOLO-style {shape} output of an image graph (box coordinates in pixels, scores "
            "in [0, 1]): judged on the decoded detections",
        )
    if image is not None and value.ndim == 3 and 1 in value.shape[:2]:
        time_major = value.shape[0] != 1  # [T, 1, C]: PyTorch CRNNs' CTC order
        steps = value.shape[0] if time_major else value.shape[1]
        if value.shape[2] >= max(2, steps):
            return Choice(
                name,
                "sequence",
                f"per-step class scores {shape}{' (time-major)' if time_major else ''} of image "
                f"input {image}, more classes than steps (a text recognizer's): judged on the "
                "greedy CTC-decoded sequence, blank 0",
            )
    if looks_like_probabilities(value):
        return Choice(
            name,
            "probabilities",
            "every row lies in [0, 1] and sums to 1: already probabilities, never re-softmaxed",
        )
    mask = _mask_input(feeds, value)
    if mask is not None:
        return Choice(
            name,
            "embedding",
            f"token states {shape} with mask input {mask} {list(feeds[mask].shape)}: mean-pooled "
            "over the kept positions, then cosine",
            mask=mask,
        )
    axis = tensors.channel_axis(tuple(value.shape))
    return Choice(
        name,
        "tensor",
        f"no known meaning: error normalized per channel (axis {axis}) of {shape}",
    )


def choose(
    *,
    kind: str,
    feeds: Feeds,
    reference: Mapping[str, np.ndarray],
    state: Mapping[str, str],
    declared: Mapping[str, tuple[str, int]],
) -> tuple[Choice, ...]:
    """Each output's metric, from fp32's ``reference`` outputs of the first held call
    (``feeds``), the package ``kind``, ``state`` (output -> the input it feeds) and the
    ``declared`` ones."""
    unknown = sorted(set(declared) - set(reference))
    if unknown:
        raise ConfigError(f"--metric names {unknown}; the graph's outputs are {sorted(reference)}")
    choices = []
    for name, value in reference.items():
        if name in declared:
            metric, blank = declared[name]
            mask = _mask_input(feeds, value) if metric == "embedding" else None
            choices.append(Choice(name, metric, "declared with --metric", blank, mask))
        else:
            choices.append(_auto(name, value, feeds, kind, state.get(name)))
    return tuple(choices)


def _score(choice: Choice, samples: list[Sample]) -> OutputScore:
    name, reason = choice.output, choice.reason
    if choice.metric == "detections":
        return detections(name, reason, samples, config=DecodeConfig())
    if choice.metric == "sequence":
        return sequences(name, reason, samples, blank=choice.blank)
    if choice.metric == "probabilities":
        return probabilities(name, reason, samples)
    if choice.metric == "embedding":
        return embeddings(name, reason, samples, mask=choice.mask)
    if choice.metric == "state":
        return state(name, reason, samples)
    if choice.metric == "exact":
        return tensors.exact(name, reason, samples)
    return tensors.tensor_error(name, reason, samples)


def judge(
    choices: Sequence[Choice],
    *,
    feeds: Sequence[Feeds],
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
) -> Verdict:
    """Every output scored by its metric over the held calls (one feeds and one output dict
    per call, shapes free to vary from call to call)."""
    scores = []
    for choice in choices:
        name = choice.output
        samples = [
            Sample(fed, want[name], got[name])
            for fed, want, got in zip(feeds, reference, candidate, strict=True)
        ]
        scores.append(_score(choice, samples))
    return Verdict(tuple(scores))
