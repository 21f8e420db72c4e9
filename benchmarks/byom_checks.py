"""This benchmark's own checks of a package against the original graph under plain
onnxruntime, on the ``check`` split (inputs the export never saw), each with its speed: the
same input through both, calls interleaved (byom_wheels.speed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import edgeinfer

_MATCH_IOU = 0.5  # PASCAL VOC's match
_SCORE, _NMS_IOU = 0.25, 0.45  # the package's defaults (ultralytics')


def _session(graph: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def _speed(package_call: Any, original_call: Any) -> str:
    from byom_wheels import speed

    return speed(package_call, original_call)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    lo, hi = np.maximum(box[:2], boxes[:, :2]), np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    areas = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    return np.asarray(inter / (np.prod(box[2:] - box[:2]) + areas - inter + 1e-9))


def _ddddocr_boxes(session: Any, picture: Image.Image) -> np.ndarray:
    """ddddocr's own pipeline (core/detection_engine.py), in numpy: BGR, scaled to fit 416 x
    416 in the top-left corner over gray 114, YOLOX grid decode, objectness x class, NMS;
    boxes [K, 4] in the picture's pixels, best first."""
    pixels = np.asarray(picture.convert("RGB"))[:, :, ::-1]
    ratio = min(416 / pixels.shape[0], 416 / pixels.shape[1])
    size = (int(pixels.shape[1] * ratio), int(pixels.shape[0] * ratio))
    resized = np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR))
    padded = np.full((416, 416, 3), 114, np.uint8)
    padded[: size[1], : size[0]] = resized
    feed = padded.transpose(2, 0, 1)[None].astype(np.float32)
    out = session.run(None, {"images": feed})[0][0]  # [3549, 6]
    grids, strides = [], []
    for stride in (8, 16, 32):
        xs, ys = np.meshgrid(np.arange(416 // stride), np.arange(416 // stride))
        grids.append(np.stack((xs, ys), 2).reshape(-1, 2))
        strides.append(np.full((grids[-1].shape[0], 1), stride))
    grid, stride_col = np.concatenate(grids), np.concatenate(strides)
    centre = (out[:, :2] + grid) * stride_col
    size_wh = np.exp(out[:, 2:4]) * stride_col
    scores = out[:, 4] * out[:, 5]
    keep = scores >= _SCORE
    boxes = np.concatenate([centre - size_wh / 2, centre + size_wh / 2], axis=1)[keep] / ratio
    order, kept = np.argsort(-scores[keep]), []
    while order.size:
        kept.append(order[0])
        order = order[1:][_iou(boxes[order[0]], boxes[order[1:]]) <= _NMS_IOU]
    height, width = pixels.shape[:2]
    return np.clip(boxes[kept], 0, [width, height, width, height])


def detector(graph: Path, package: Path, folder: Path) -> dict[str, Any]:
    """F1 of the package's detections against ddddocr's own pipeline on the original graph."""
    session = _session(graph)
    pictures = [Image.open(p).convert("RGB") for p in sorted(folder.glob("*.png"))]
    found = wanted = matched = 0
    with edgeinfer.load(package, threads=1) as model:
        for picture in pictures:
            want = _ddddocr_boxes(session, picture)
            got = [d.box for d in model.detect(np.asarray(picture))[0]]
            free = np.ones(len(want), bool)
            for box in got:
                overlap = np.where(free, _iou(np.array(box), want), 0) if len(want) else []
                if len(overlap) and max(overlap) >= _MATCH_IOU:
                    free[int(np.argmax(overlap))] = False
                    matched += 1
            found, wanted = found + len(got), wanted + len(want)
        first = np.asarray(pictures[0])
        speed = _speed(lambda: model.detect(first), lambda: _ddddocr_boxes(session, pictures[0]))
    f1 = 2 * matched / (found + wanted) if found + wanted else 1.0
    return {
        "check": f"detection F1 {f1:.4f} vs ddddocr's own pipeline on the fp32 graph ({matched} "
        f"of {wanted} boxes matched, {found} found, {len(pictures)} unseen captchas)",
        "speed": speed,
    }


def _ctc(scores: np.ndarray) -> tuple[int, ...]:
    """Greedy CTC of [1, T, C] or time-major [T, 1, C] scores (blank 0)."""
    steps = scores[0] if scores.shape[0] == 1 else scores[:, 0]
    ids = steps.argmax(axis=-1)
    return tuple(int(i) for n, i in enumerate(ids) if i and (n == 0 or i != ids[n - 1]))


def _calls(folder: Path, name: str) -> list[np.ndarray]:
    return [np.load(p)[name][0] for p in sorted(folder.glob("*.npz"))]


def recognizer(graph: Path, package: Path, folder: Path, name: str) -> dict[str, Any]:
    """Decoded lines equal between the package and the original (greedy CTC); a PP-OCR graph
    names its characters in its metadata, so one line is shown as text."""
    import onnx

    session = _session(graph)
    lines = [x[None] for x in _calls(folder, name)]
    meta = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
    chars = ["", *meta["character"].splitlines(), " "] if "character" in meta else None
    equal, sample = 0, ""
    with edgeinfer.load(package, threads=1) as model:
        for index, line in enumerate(lines):
            (want,) = session.run(None, {name: line})
            got = next(iter(model.run({name: line}).values()))
            equal += _ctc(want) == _ctc(got)
            if index == 0 and chars:
                sample = "".join(chars[i] for i in _ctc(got))
        middle = sorted(lines, key=lambda x: x.shape[-1])[len(lines) // 2]
        speed = _speed(lambda: model.run({name: middle}), lambda: session.run(None, {name: middle}))
    widths = sorted(x.shape[-1] for x in lines)
    text = f'; line 1 reads "{sample}"' if sample else ""
    return {
        "check": f"{equal} of {len(lines)} unseen lines decode equal (widths {widths[0]}-"
        f"{widths[-1]} px){text}",
        "speed": speed,
    }


def argmax_raw(graph: Path, package: Path, path: Path, name: str) -> dict[str, Any]:
    """Top-1 agreement of a raw package's first output with the original's, row by row."""
    session = _session(graph)
    rows = np.load(path)[name]
    agree = 0
    with edgeinfer.load(package, threads=1) as model:
        for row in rows:
            (want,) = session.run(None, {name: row[None]})
            got = next(iter(model.run({name: row[None]}).values()))
            agree += int(want.argmax()) == int(got.argmax())
        first = rows[:1]
        speed = _speed(lambda: model.run({name: first}), lambda: session.run(None, {name: first}))
    return {"check": f"top-1 equal on {agree} of {len(rows)} unseen files", "speed": speed}


def _direction_feed(picture: Image.Image) -> np.ndarray:
    """PP-OCR's classifier input as the package makes it: 192 x 48, values in [-1, 1]."""
    pixels = np.asarray(picture.resize((192, 48), Image.Resampling.BILINEAR), np.float32)
    return ((pixels / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def direction(graph: Path, package: Path, folder: Path) -> dict[str, Any]:
    """Label agreement with the original, and how many turned lines each one tells."""
    session = _session(graph)
    name = session.get_inputs()[0].name
    files = sorted(folder.glob("*.png"))
    agree = right_package = right_original = 0
    with edgeinfer.load(package, threads=1) as model:
        for file in files:
            picture = Image.open(file).convert("RGB")
            truth = file.stem.split("-")[1]
            want = ("0", "180")[
                int(session.run(None, {name: _direction_feed(picture)})[0].argmax())
            ]
            got = model.classify(np.asarray(picture)[None])[0].label
            agree += want == got
            right_package += got == truth
            right_original += want == truth
        first = Image.open(files[0]).convert("RGB")
        speed = _speed(
            lambda: model.classify(np.asarray(first)[None]),
            lambda: session.run(None, {name: _direction_feed(first)}),
        )
    return {
        "check": f"label equal on {agree} of {len(files)} unseen lines; right direction: "
        f"package {right_package}, original {right_original}",
        "speed": speed,
    }


def maps(graph: Path, package: Path, folder: Path, name: str) -> dict[str, Any]:
    """The largest absolute difference of any output between package and original."""
    session = _session(graph)
    pages = [x[None] for x in _calls(folder, name)]
    names = [o.name for o in session.get_outputs()]
    worst = 0.0
    with edgeinfer.load(package, threads=1) as model:
        for page in pages:
            got = model.run({name: page})
            for output, want in zip(names, session.run(None, {name: page}), strict=True):
                worst = max(worst, float(np.abs(want - got[output]).max()))
        first = pages[0]
        speed = _speed(lambda: model.run({name: first}), lambda: session.run(None, {name: first}))
    check = f"largest difference from the original {worst:.2g} over {len(pages)} unseen pages"
    return {"check": check, "speed": speed}


def halve_scores(graph: Path) -> None:
    """Rewrite a detector graph so that its output's objectness and class channels come out at
    half their value (a wrong dequantization scale on the score channels)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(graph))
    output = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{output}_raw" if o == output else o for o in node.output]
    attributes = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    scale = np.array([1.0] * 4 + [0.5] * (attributes - 4), np.float32)
    model.graph.initializer.append(numpy_helper.from_array(scale, f"{output}_scale"))
    model.graph.node.append(helper.make_node("Mul", [f"{output}_raw", f"{output}_scale"], [output]))
    onnx.save(model, str(graph))
