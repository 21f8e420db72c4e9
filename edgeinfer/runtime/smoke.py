"""The smoke check: a few inputs recorded at export with their outputs, re-run on a device.

It answers "is this the package that was exported, working?" after a copy or a deploy — not "is
it accurate" (the export's gate did that). A device may be another CPU (x86 and Arm int8 kernels
round differently), so the check compares what cannot drift across machines and a broken
package cannot keep: an embedding's direction (cosine >= ``MIN_COSINE``), the top label of an
input the model is sure about, the greedy tokens of a prompt up to the first near-tie, and a raw
graph's outputs within ``RAW_RELATIVE`` of their size.

The manifest's ``smoke`` field::

    {"version": 1, "kind": <io.kind>, "cases": [...], "tolerance": {...}}

Images travel as a small thumbnail (base64 uint8) that ``record`` and ``check`` both blow up to
the package's size by pixel repetition, so both sides classify the very same pixels.

A raw graph's arrays live beside the manifest in ``smoke.npz`` (listed in its ``files``), the
manifest naming them, within ``MAX_ARRAY_BYTES``: an output of more than ``MAX_OUTPUT_VALUES``
values is kept as every k-th value (``stride``), an input too large to store is drawn again from
a seed over its recorded range (``generated``), and cases stop where the budget ends.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import PackageError
from edgeinfer.package_io import (
    DecoderIO,
    ImageClassifierIO,
    ImageDetectorIO,
    ImageSegmenterIO,
    RawIO,
)
from edgeinfer.runtime.kinds.classify import ClassifyModel
from edgeinfer.runtime.kinds.detect import DetectModel
from edgeinfer.runtime.kinds.embed import EmbedModel
from edgeinfer.runtime.kinds.generate import GenerateModel
from edgeinfer.runtime.kinds.raw import RawModel
from edgeinfer.runtime.kinds.segment import SegmentModel
from edgeinfer.runtime.model import narrow

if TYPE_CHECKING:
    from edgeinfer.runtime.model import Model

__all__ = ["ARRAYS_NAME", "MAX_ARRAY_BYTES", "check", "record", "write_arrays"]

MIN_COSINE = 0.95  # int8 across CPUs keeps ~0.99; a wrong or damaged graph falls far below
DECIDED = 0.3  # a top label leading the runner-up by this much cannot flip across machines
PROB_TOLERANCE = 0.3  # the top label's probability moves less than this across machines
TOKEN_MARGIN = 1.0  # logit gap of a greedy step that cannot flip across machines
GREEDY_TOKENS = 4
# A raw output may move this much (L2, relative to its size, plus RAW_ABSOLUTE per value)
# across machines: int8 kernels round differently; a wrong graph moves it by ~100 %.
RAW_RELATIVE = 0.05
RAW_ABSOLUTE = 1e-3
THUMBNAIL = 8  # images are stored at 1/8 of the package's side
_CASES = 3
_PROMPT_TOKENS = 64  # smoke prompts are short: the check must take milliseconds
ARRAYS_NAME = "smoke.npz"
# A raw package's smoke arrays at most: small beside any graph, and a deploy moves them too.
MAX_ARRAY_BYTES = 1 << 20
# Values kept of one output: a strided sample of this many shows a wrong graph as well.
MAX_OUTPUT_VALUES = 4096


def record(model: Model, inputs: Sequence[Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The smoke field for ``model``: its outputs on the most decided of ``inputs`` (texts,
    uint8 RGB images, float images, prompts — as the package's kind takes), and the arrays
    for ``smoke.npz`` (raw packages; empty for the others)."""
    io = model.manifest.io
    kind = io.kind
    arrays: dict[str, np.ndarray] = {}
    if isinstance(io, DecoderIO):
        cases = _greedy_cases(model, [str(p) for p in inputs])
    elif isinstance(io, RawIO):
        cases = _raw_cases(model, inputs, arrays)
    elif isinstance(io, (ImageDetectorIO, ImageSegmenterIO)):
        cases = _detection_cases(model, inputs)
    elif isinstance(model, EmbedModel):
        vectors = model.embed([str(t) for t in inputs[:_CASES]])
        cases = [
            {"text": str(t), "vector": [round(float(x), 5) for x in v]}
            for t, v in zip(inputs, vectors, strict=False)
        ]
    else:
        cases = _label_cases(model, inputs)
    tolerance = {
        "min_cosine": MIN_COSINE,
        "decided": DECIDED,
        "probability": PROB_TOLERANCE,
        "token_margin": TOKEN_MARGIN,
        "raw_relative": RAW_RELATIVE,
    }
    field = {"version": 1, "kind": kind, "cases": cases, "tolerance": tolerance}
    return ({**field, "arrays": ARRAYS_NAME} if arrays else field), arrays


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``smoke.npz``: the arrays ``record`` returned, compressed."""
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]  # numpy's stub wants a str key


def _raw_cases(
    model: Model, inputs: Sequence[Any], arrays: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    """Cases of named arrays (into ``arrays``) while they fit in ``MAX_ARRAY_BYTES``."""
    cases: list[dict[str, Any]] = []
    used = 0
    for index, feeds in enumerate(inputs[:_CASES]):
        case: dict[str, Any] = {"feeds": {}, "generated": {}, "outputs": {}, "stride": {}}
        fed: dict[str, np.ndarray] = {}
        new: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            value = np.asarray(value)
            key = f"case{index}/feed/{name}"
            if value.nbytes > MAX_ARRAY_BYTES // (2 * _CASES):
                spec = _range_of(value, seed=index)
                case["generated"][name] = spec
                fed[name] = _generate(spec)
            else:
                case["feeds"][name] = key
                fed[name] = new[key] = value
        for name, value in narrow(model, RawModel).run(fed).items():
            flat = np.asarray(value).reshape(-1)
            stride = max(1, math.ceil(flat.size / MAX_OUTPUT_VALUES))
            key = f"case{index}/output/{name}"
            case["outputs"][name] = key
            case["stride"][name] = stride
            new[key] = np.ascontiguousarray(flat[::stride])
        size = sum(a.nbytes for a in new.values())
        if cases and used + size > MAX_ARRAY_BYTES:
            break
        used += size
        arrays.update(new)
        cases.append(case)
    return cases


def _range_of(value: np.ndarray, *, seed: int) -> dict[str, Any]:
    """What regenerates an input of ``value``'s shape, type and range."""
    low, high = (float(value.min()), float(value.max())) if value.size else (0.0, 0.0)
    return {"shape": list(value.shape), "dtype": str(value.dtype), "low": low, "high": high,
            "seed": seed}  # fmt: skip


def _generate(spec: dict[str, Any]) -> np.ndarray:
    """The input ``spec`` stands for: uniform over its range from its seed (PCG64 draws the
    same values on every machine)."""
    rng = np.random.default_rng(int(spec["seed"]))
    dtype = np.dtype(str(spec["dtype"]))
    shape = tuple(int(d) for d in spec["shape"])
    low, high = float(spec["low"]), float(spec["high"])
    if dtype.kind in "iub":
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def check(model: Model) -> None:
    """Re-run the package's smoke cases; ``PackageError`` says which differs and how."""
    smoke = model.manifest.smoke
    if not smoke or not smoke.get("cases"):
        raise PackageError(f"{model.path.name} has no smoke cases; re-export it with edgeinfer")
    if smoke.get("kind") != model.manifest.io.kind:
        raise PackageError(f"{model.path.name}: its smoke cases are for another package kind")
    tolerance = smoke.get("tolerance", {})
    arrays = _stored_arrays(model, smoke)
    for index, case in enumerate(smoke["cases"]):
        problem = _check_case(model, case, tolerance, arrays)
        if problem:
            raise PackageError(f"{model.path.name} fails its smoke check (case {index}): {problem}")


def _stored_arrays(model: Model, smoke: dict[str, Any]) -> dict[str, np.ndarray]:
    """The package's ``smoke.npz`` (verified with the package's files), when it has one."""
    name = smoke.get("arrays")
    if name is None:
        return {}
    if name not in model.manifest.files:
        raise PackageError(f"{model.path.name}: its smoke arrays {name} are not in its files")
    try:
        with np.load(model.path / str(name), allow_pickle=False) as data:
            return {key: np.asarray(data[key]) for key in data.files}
    except (OSError, ValueError) as exc:
        raise PackageError(f"{model.path.name}: cannot read its smoke arrays: {exc}") from exc


def _check_case(
    model: Model, case: dict[str, Any], tolerance: dict[str, Any], arrays: dict[str, np.ndarray]
) -> str | None:
    if "vector" in case:
        got = narrow(model, EmbedModel).embed(case["text"])[0]
        want = np.asarray(case["vector"], np.float32)
        cosine = float(got @ want / max(np.linalg.norm(got) * np.linalg.norm(want), 1e-12))
        limit = float(tolerance.get("min_cosine", MIN_COSINE))
        return None if cosine >= limit else f"embedding cosine {cosine:.4f} < {limit}"
    if "tokens" in case:
        return _check_tokens(model, case)
    if "detection" in case:
        return _check_detection(model, case)
    if "feeds" in case:
        relative = float(tolerance.get("raw_relative", RAW_RELATIVE))
        return _check_outputs(model, case, relative, arrays)
    result = narrow(model, ClassifyModel).classify(_input(model, case))[0]
    if case["decided"] and result.label != case["label"]:
        return f"label {result.label!r}, expected {case['label']!r}"
    moved = abs(result.scores.get(case["label"], 0.0) - float(case["score"]))
    limit = float(tolerance.get("probability", PROB_TOLERANCE))
    return None if moved <= limit else f"probability of {case['label']!r} moved by {moved:.3f}"


def _check_outputs(
    model: Model, case: dict[str, Any], relative: float, arrays: dict[str, np.ndarray]
) -> str | None:
    """Every recorded output (its strided sample) within ``relative`` of its size (L2), plus
    RAW_ABSOLUTE per value."""
    try:
        feeds = {name: arrays[key] for name, key in case["feeds"].items()}
        feeds.update({name: _generate(spec) for name, spec in case["generated"].items()})
        wanted = {name: arrays[key] for name, key in case["outputs"].items()}
    except KeyError as exc:
        return f"its smoke arrays lack {exc}"
    got = narrow(model, RawModel).run(feeds)
    for name, recorded in wanted.items():
        want = recorded.astype(np.float64)
        if name not in got:
            return f"output {name} is missing"
        sample = np.asarray(got[name], np.float64).reshape(-1)[:: int(case["stride"][name])]
        if sample.shape != want.shape:
            return f"output {name} has another shape"
        error = float(np.linalg.norm(sample - want))
        allowed = relative * float(np.linalg.norm(want)) + RAW_ABSOLUTE * np.sqrt(want.size)
        if error > allowed:
            return f"output {name} moved by {error:.4g} (L2), more than {allowed:.4g}"
    return None


def _found(model: Model, picture: np.ndarray) -> list[Any]:
    """A detector's detections or a segmenter's masks (each with a box, label, score)."""
    if isinstance(model, SegmentModel):
        return list(model.segment(picture)[0])
    return list(narrow(model, DetectModel).detect(picture)[0])


def _detection_cases(model: Model, inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """Pictures with their best detection or mask (None: nothing found)."""
    cases = []
    for item in inputs[:_CASES]:
        case = _encode(model, item)
        found = _found(model, _input(model, case)[0])
        best = found[0] if found else None
        cases.append(
            {**case, "detection": None if best is None else {
                "box": [round(v, 2) for v in best.box], "label": best.label,
                "score": round(best.score, 6)}}
        )  # fmt: skip
    return cases


def _check_detection(model: Model, case: dict[str, Any]) -> str | None:
    """A decided best detection (``DECIDED`` above the threshold) is found again: same
    label, IoU >= 0.5; any other case only has to run."""
    from edgeinfer.runtime.kinds.detect import iou

    found = _found(model, _input(model, case)[0])
    best = case["detection"]
    io = model.manifest.io
    threshold = io.score_threshold if isinstance(io, (ImageDetectorIO, ImageSegmenterIO)) else 0.0
    if best is None or float(best["score"]) < threshold + DECIDED:
        return None
    want = np.asarray(best["box"], np.float32)
    boxes = np.array([d.box for d in found if d.label == best["label"]], np.float32)
    if len(boxes) and float(iou(want, boxes.reshape(-1, 4)).max()) >= 0.5:
        return None
    return f"its best detection ({best['label']} at {best['box']}) is not found again"


def _label_cases(model: Model, inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """The inputs whose top label leads most, with that label and its probability."""
    encoded = [_encode(model, x) for x in inputs]
    classifier = narrow(model, ClassifyModel)
    results = [classifier.classify(_input(model, case))[0] for case in encoded]
    margins = [_margin(r.scores) for r in results]
    best = sorted(range(len(results)), key=lambda i: -margins[i])[:_CASES]
    return [
        {
            **encoded[i],
            "label": results[i].label,
            "score": round(results[i].score, 6),
            "decided": margins[i] >= DECIDED,
        }
        for i in best
    ]


def _margin(scores: dict[str, float]) -> float:
    top = sorted(scores.values(), reverse=True)
    return top[0] - (top[1] if len(top) > 1 else 0.0)


def _encode(model: Model, item: Any) -> dict[str, Any]:
    """A case's input as JSON: text as is, an image as its thumbnail."""
    if isinstance(item, str):
        return {"text": item}
    image = np.asarray(item)
    if image.dtype == np.uint8:  # [H, W, 3] RGB
        small = image[::THUMBNAIL, ::THUMBNAIL]
        return {"thumbnail": _b64(small), "shape": list(small.shape), "dtype": "uint8"}
    pixels = np.clip(np.rint(np.asarray(item, np.float32) * 255), 0, 255).astype(np.uint8)
    return {"thumbnail": _b64(pixels), "shape": list(pixels.shape), "dtype": "unit-float"}


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def _input(model: Model, case: dict[str, Any]) -> Any:
    """The model input a case stands for (the same pixels at record and at check)."""
    if "text" in case:
        return case["text"]
    raw = np.frombuffer(base64.b64decode(case["thumbnail"]), np.uint8).reshape(case["shape"])
    if case["dtype"] == "unit-float":  # float intensities, stored at full size
        return (raw.astype(np.float32) / 255.0)[None]
    io = model.manifest.io
    if not isinstance(io, (ImageClassifierIO, ImageDetectorIO, ImageSegmenterIO)):
        raise PackageError(f"{model.path.name}: an image smoke case for a non-image package")
    height, width = io.image.height, io.image.width
    big = np.repeat(np.repeat(raw, THUMBNAIL, axis=0), THUMBNAIL, axis=1)[:height, :width]
    return np.ascontiguousarray(big)[None]


def _greedy_cases(model: Model, prompts: list[str]) -> list[dict[str, Any]]:
    """Each prompt's first greedy tokens with each step's logit margin (one-row steps: the
    bits of the engine's, see ``generate/engine.py``)."""
    from edgeinfer.runtime.generate.decoding import Decoder

    context = min(model.manifest.io_as(DecoderIO).context_length, _PROMPT_TOKENS + GREEDY_TOKENS)
    generator = Decoder(model.path, model.manifest, config=model.config, context_length=context)
    cases = []
    for prompt in prompts:
        ids = narrow(model, GenerateModel).encode(prompt)
        if len(ids) > _PROMPT_TOKENS:
            continue
        logits = generator.prefill(ids)
        tokens: list[int] = []
        margins: list[float] = []
        for step in range(GREEDY_TOKENS):
            top = np.argsort(logits)[-2:]  # runner-up, best
            if int(top[1]) in generator.stop_token_ids:
                break  # generate() ends here too
            tokens.append(int(top[1]))
            margins.append(round(float(logits[top[1]] - logits[top[0]]), 4))
            logits = generator.decode_one_token(tokens[-1], len(ids) + step)
        if tokens:
            cases.append({"prompt": prompt, "tokens": tokens, "margins": margins})
    return cases[:_CASES]


def _check_tokens(model: Model, case: dict[str, Any]) -> str | None:
    """Greedy tokens equal up to the first step whose recorded margin is a near-tie."""
    got = list(
        narrow(model, GenerateModel)
        .generate(case["prompt"], max_new_tokens=len(case["tokens"]))
        .token_ids
    )
    for step, (want, margin) in enumerate(zip(case["tokens"], case["margins"], strict=True)):
        if margin < TOKEN_MARGIN:
            return None
        if step >= len(got) or got[step] != want:
            return f"greedy token {step} is {got[step] if step < len(got) else None}, not {want}"
    return None
