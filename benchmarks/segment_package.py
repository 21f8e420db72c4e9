"""A segmenter package's masks against the original graph's, and its speed.

The graph is tests/onnx_models.py's ``yolo_seg_like`` at 160 x 160 with 32 mask coefficients
and 40 x 40 prototypes (ultralytics' -seg layout: ``[1, 4+1+32, 25600]`` and ``[1, 32, 40,
40]``; no YOLO-seg ships in a PyPI wheel that this machine can install). Exported fp32 and
int8-static with the CLI, each package's masks on the ``gate`` photos (the export gates on
``tune`` photos, calibrates on ``calibration`` ones) are compared with masks computed here from
the original graph by ultralytics' own recipe (letterbox, sigmoid(coefficients . prototypes),
bilinear upsampling, crop to the box, >= 0.5; greedy class-aware NMS): mean mask
IoU of each package instance with the original's of the same box. Speed: segment() per photo
against the original's ONNX Runtime run plus that numpy recipe, interleaved, medians.

    PYTHONPATH=. python benchmarks/segment_package.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
_ROUNDS = 2
_SIDE = 480  # check photos scaled to this longer side: full-picture masks of every instance


def _original(
    session: object, picture: np.ndarray, spec: object
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(box in picture pixels, full-picture mask) per instance, best first, by ultralytics'
    recipe on the original graph."""
    from PIL import Image

    from edgeinfer.runtime.kinds import pictures
    from edgeinfer.runtime.kinds.detect import DecodeConfig, decode_rows, nms
    from edgeinfer.runtime.tasks import prepare_images

    h, w = picture.shape[:2]
    pixels = prepare_images(pictures.fit(Image.fromarray(picture), spec)[None], image=spec)
    head, protos = session.run(None, {"images": pixels})  # type: ignore[attr-defined]
    rows = head[0].T
    config = DecodeConfig()
    boxes, scores, labels, keep = decode_rows(rows[:, :5], objectness=False, config=config)
    chosen = nms(boxes, scores, labels, config)
    scale, left, top = pictures.letterbox(w, h, spec)  # type: ignore[arg-type]
    out = []
    for index in chosen:
        coef = rows[keep][index, 5:]
        logit = (coef @ protos[0].reshape(protos.shape[1], -1)).reshape(protos.shape[2:])
        up = np.asarray(
            Image.fromarray(logit.astype(np.float32), mode="F").resize(
                (160, 160), Image.Resampling.BILINEAR
            )
        )
        box = boxes[index]
        ys, xs = np.mgrid[0:160, 0:160]
        # ultralytics' crop_mask: pixel indices in [x1, x2) and [y1, y2)
        inside = (xs >= box[0]) & (xs < box[2]) & (ys >= box[1]) & (ys < box[3])
        prob = np.where(inside, 1 / (1 + np.exp(-up)), 0.0)
        nw, nh = round(w * scale), round(h * scale)
        region = prob[top : top + nh, left : left + nw].astype(np.float32)
        mask = (
            np.asarray(Image.fromarray(region, mode="F").resize((w, h), Image.Resampling.BILINEAR))
            >= 0.5
        )
        picture_box = np.clip((box - [left, top, left, top]) / scale, 0, [w, h, w, h])
        out.append((picture_box, mask))
    return out


def main() -> int:
    import onnxruntime as ort
    from onnx_models import yolo_seg_like
    from PIL import Image

    import edgeinfer
    from edgeinfer.export.data.photos import photos

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="segment-package-"))
    meta = {"task": "segment", "names": "{0: 'thing'}", "imgsz": "[160, 160]"}
    graph = yolo_seg_like(work / "seg.onnx", coefficients=32, size=160, metadata=meta)
    tune = work / "tune"
    tune.mkdir()
    for i, photo in enumerate(photos("tune")):
        Image.fromarray(photo).save(tune / f"{i:02d}.png")
    check = []
    for photo in photos("gate"):
        image = Image.fromarray(photo)
        image.thumbnail((_SIDE, _SIDE))
        check.append(np.asarray(image))
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    print(f"load average {os.getloadavg()[0]:.1f}; {len(check)} unseen photos")
    for quantize in ("none", "int8-static"):
        out = work / quantize
        command = [sys.executable, "-m", "edgeinfer", "export", str(graph), "-o", str(out),
                   "--task", "segment", "--quantize", quantize, "--eval-data", str(tune),
                   "--keep-best", "--force-quantize"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        print(
            f"\nedgeinfer export seg.onnx -o {quantize} --task segment --quantize {quantize} "
            f"--eval-data tune/ --keep-best --force-quantize: exit {done.returncode}"
        )
        if done.returncode:
            print(done.stderr[-500:])
            continue
        report = json.loads((out / "report.json").read_text())
        for name, entry in report["variants"].items():
            print(f"  {name}: {entry['accuracy']['summary']}")
        print(f"  shipped {report['chosen']}; warnings: {report['warnings']}")
        with edgeinfer.load(out, threads=1) as model:
            spec = model.manifest.io.image  # type: ignore[union-attr]
            ious, lost = [], 0
            for picture in check:
                want = _original(session, picture, spec)
                got = model.segment(picture)[0]
                h, w = picture.shape[:2]
                for box, mask in want:
                    near = [s for s in got if np.abs(np.array(s.box) - box).max() < 2.0]
                    if not near:
                        lost += 1
                        continue
                    best = 0.0  # small boxes 2 px apart are other instances: the best of them
                    for seg in near:
                        full = seg.full(w, h)
                        union = (full | mask).sum()
                        best = max(best, (full & mask).sum() / union if union else 1.0)
                    ious.append(best)
            mine, theirs = [], []
            for _ in range(_ROUNDS):
                for picture in check:
                    started = time.perf_counter()
                    model.segment(picture)
                    mine.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    _original(session, picture, spec)
                    theirs.append(time.perf_counter() - started)
            print(
                f"  precision {model.manifest.precision}; {len(ious)} instances matched by "
                f"box, {lost} not found; mask IoU vs the original: mean {np.mean(ious):.4f}, "
                f"min {np.min(ious):.4f}"
            )
            print(
                f"  segment() {np.median(mine) * 1e3:.1f} ms per photo vs the original + "
                f"numpy recipe {np.median(theirs) * 1e3:.1f} ms (medians, one thread)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
