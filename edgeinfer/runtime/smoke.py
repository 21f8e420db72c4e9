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
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer.errors import PackageError
from edgeinfer.package_io import DecoderIO, ImageClassifierIO, RawIO

if TYPE_CHECKING:
    from edgeinfer.runtime.model import Model

__all__ = ["check", "record"]

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


def record(model: Model, inputs: Sequence[Any]) -> dict[str, Any]:
    """The smoke field for ``model``: its outputs on the most decided of ``inputs`` (texts,
    uint8 RGB images, float images, prompts — as the package's kind takes)."""
    io = model.manifest.io
    kind = io.kind
    if isinstance(io, DecoderIO):
        cases = _greedy_cases(model, [str(p) for p in inputs])
    elif isinstance(io, RawIO):
        cases = [
            {
                "feeds": {k: _array_case(v) for k, v in feeds.items()},
                "outputs": {k: _array_case(v) for k, v in model.run(feeds).items()},
            }
            for feeds in inputs[:_CASES]
        ]
    elif model.task == "embed":
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
    return {"version": 1, "kind": kind, "cases": cases, "tolerance": tolerance}


def check(model: Model) -> None:
    """Re-run the package's smoke cases; ``PackageError`` says which differs and how."""
    smoke = model.manifest.smoke
    if not smoke or not smoke.get("cases"):
        raise PackageError(f"{model.path.name} has no smoke cases; re-export it with edgeinfer")
    if smoke.get("kind") != model.manifest.io.kind:
        raise PackageError(f"{model.path.name}: its smoke cases are for another package kind")
    tolerance = smoke.get("tolerance", {})
    for index, case in enumerate(smoke["cases"]):
        problem = _check_case(model, case, tolerance)
        if problem:
            raise PackageError(f"{model.path.name} fails its smoke check (case {index}): {problem}")


def _check_case(model: Model, case: dict[str, Any], tolerance: dict[str, Any]) -> str | None:
    if "vector" in case:
        got = model.embed(case["text"])[0]
        want = np.asarray(case["vector"], np.float32)
        cosine = float(got @ want / max(np.linalg.norm(got) * np.linalg.norm(want), 1e-12))
        limit = float(tolerance.get("min_cosine", MIN_COSINE))
        return None if cosine >= limit else f"embedding cosine {cosine:.4f} < {limit}"
    if "tokens" in case:
        return _check_tokens(model, case)
    if "feeds" in case:
        return _check_outputs(model, case, float(tolerance.get("raw_relative", RAW_RELATIVE)))
    result = model.classify(_input(model, case))[0]
    if case["decided"] and result.label != case["label"]:
        return f"label {result.label!r}, expected {case['label']!r}"
    moved = abs(result.scores.get(case["label"], 0.0) - float(case["score"]))
    limit = float(tolerance.get("probability", PROB_TOLERANCE))
    return None if moved <= limit else f"probability of {case['label']!r} moved by {moved:.3f}"


def _array_case(array: np.ndarray) -> dict[str, Any]:
    array = np.asarray(array)
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": _b64(array)}


def _array(case: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(case["data"])
    array: np.ndarray = np.frombuffer(raw, np.dtype(case["dtype"])).reshape(case["shape"])
    return array


def _check_outputs(model: Model, case: dict[str, Any], relative: float) -> str | None:
    """Every recorded output within ``relative`` of its size (L2), plus RAW_ABSOLUTE."""
    got = model.run({k: _array(v) for k, v in case["feeds"].items()})
    for name, recorded in case["outputs"].items():
        want = _array(recorded).astype(np.float64)
        if name not in got or np.shape(got[name]) != want.shape:
            return f"output {name} is missing or has another shape"
        error = float(np.linalg.norm(np.asarray(got[name], np.float64) - want))
        allowed = relative * float(np.linalg.norm(want)) + RAW_ABSOLUTE * np.sqrt(want.size)
        if error > allowed:
            return f"output {name} moved by {error:.4g} (L2), more than {allowed:.4g}"
    return None


def _label_cases(model: Model, inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """The inputs whose top label leads most, with that label and its probability."""
    encoded = [_encode(model, x) for x in inputs]
    results = [model.classify(_input(model, case))[0] for case in encoded]
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
    if not isinstance(io, ImageClassifierIO):
        raise PackageError(f"{model.path.name}: an image smoke case for a non-image package")
    height, width = io.image.height, io.image.width
    big = np.repeat(np.repeat(raw, THUMBNAIL, axis=0), THUMBNAIL, axis=1)[:height, :width]
    return np.ascontiguousarray(big)[None]


def _greedy_cases(model: Model, prompts: list[str]) -> list[dict[str, Any]]:
    """Each prompt's first greedy tokens with each step's logit margin."""
    from edgeinfer.runtime.generate.generator import Generator

    context = min(model.manifest.io_as(DecoderIO).context_length, _PROMPT_TOKENS + GREEDY_TOKENS)
    generator = Generator(model.path, model.manifest, config=model.config, context_length=context)
    cases = []
    for prompt in prompts:
        ids = generator.encode(prompt)
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
    got = list(model.generate(case["prompt"], max_new_tokens=len(case["tokens"])).token_ids)
    for step, (want, margin) in enumerate(zip(case["tokens"], case["margins"], strict=True)):
        if margin < TOKEN_MARGIN:
            return None
        if step >= len(got) or got[step] != want:
            return f"greedy token {step} is {got[step] if step < len(got) else None}, not {want}"
    return None
