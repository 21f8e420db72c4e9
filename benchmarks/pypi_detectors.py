"""A detector from a PyPI wheel exported as a user brings it, and checked against that wheel's
own pipeline on photos the export never saw.

NudeNet 3.4.2 (``pip install --no-deps nudenet==3.4.2 opencv-python-headless``; the package is
MIT, its ``320n.onnx`` an ultralytics YOLOv8n export whose metadata names AGPL-3.0) ships a
YOLOv8 graph with dynamic dims (``[batch, 3, height, width]`` -> ``[batch, 22, <symbolic>]``)
and metadata (``imgsz`` 320, 18 ``names``). Its own pipeline pads each photo with black at the
bottom and right, scales it to 320 x 320 and suppresses across classes (``cv2.dnn.NMSBoxes``,
score 0.25, IoU 0.45). Exported three ways, with the exact commands:

- ultralytics' defaults (centred letterbox in gray 114, class-aware NMS);
- its own pipeline's settings (``--preprocess pad=top-left --preprocess fill=0
  --nms agnostic=true``);
- the same with ``--quantize int8-static``.

Each package's detections on the ``gate`` photos of edgeinfer/export/data/photos.py (the export
is gated on the ``tune`` photos and calibrates on the ``calibration`` ones) are matched to
NudeNet's (same label, IoU >= 0.5), and each package's detect() is timed against NudeNet's
detect() in interleaved rounds (one thread each).

    PYTHONPATH=SITE python benchmarks/pypi_detectors.py --site SITE [--json]
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

_ROUNDS = 5  # interleaved timing rounds over every check photo


def _export(graph: Path, out: Path, eval_dir: Path, *flags: str) -> dict[str, Any]:
    """``edgeinfer export`` as a user runs it; its command, exit code and report."""
    command = ["edgeinfer", "export", str(graph), "-o", str(out), "--task", "auto",
               "--eval-data", str(eval_dir), *flags]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "edgeinfer", *command[1:]], capture_output=True, text=True
    )
    report = json.loads((out / "report.json").read_text()) if done.returncode == 0 else {}
    return {"command": " ".join(command), "exit": done.returncode, "report": report,
            "error": done.stderr.strip().splitlines()[-1:] if done.returncode else []}  # fmt: skip


def _theirs(detector: Any, path: Path) -> list[tuple[str, float, list[float]]]:
    found = detector.detect(str(path))
    return [(d["class"], float(d["score"]),
             [d["box"][0], d["box"][1], d["box"][0] + d["box"][2], d["box"][1] + d["box"][3]])
            for d in found]  # fmt: skip


def _matched(ours: list[Any], theirs: list[tuple[str, float, list[float]]]) -> int:
    from edgeinfer.runtime.kinds.detect import iou

    free = [True] * len(theirs)
    hits = 0
    for d in ours:
        best, where = 0.0, -1
        for i, (label, _, box) in enumerate(theirs):
            if free[i] and label == d.label:
                value = float(iou(np.array(d.box), np.array([box]))[0])
                if value > best:
                    best, where = value, i
        if best >= 0.5:
            free[where], hits = False, hits + 1
    return hits


def _median_ms(call: Any, paths: list[Path], other: Any) -> tuple[float, float]:
    """Median ms per photo of ``call`` and ``other``, interleaved photo by photo."""
    mine, theirs = [], []
    for _ in range(_ROUNDS):
        for path in paths:
            for fn, into in ((call, mine), (other, theirs)):
                started = time.perf_counter()
                fn(path)
                into.append((time.perf_counter() - started) * 1e3)
    return float(np.median(mine)), float(np.median(theirs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, required=True, help="where nudenet is installed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from nudenet import NudeDetector
    from PIL import Image

    import edgeinfer
    from edgeinfer.export.data.photos import photos

    graph = args.site / "nudenet" / "320n.onnx"
    work = Path(tempfile.mkdtemp(prefix="pypi-detectors-"))
    split = {}
    for name in ("tune", "gate"):
        folder = work / name
        folder.mkdir()
        for i, photo in enumerate(photos(name)):  # type: ignore[arg-type]
            Image.fromarray(photo).save(folder / f"{i:02d}.png")
        split[name] = sorted(folder.glob("*.png"))
    own = ("--preprocess", "pad=top-left", "--preprocess", "fill=0", "--nms", "agnostic=true")
    runs = {
        "ultralytics defaults, fp32": ("--quantize", "none"),
        "its pipeline's settings, fp32": (*own, "--quantize", "none"),
        "its pipeline's settings, int8-static": (
            *own,
            "--quantize",
            "int8-static",
            "--keep-best",
        ),
    }
    theirs_model = NudeDetector()
    theirs = {p: _theirs(theirs_model, p) for p in split["gate"]}
    rows = []
    for name, flags in runs.items():
        out = work / name.replace(" ", "-").replace(",", "").replace("'", "")
        exported = _export(graph, out, work / "tune", *flags)
        row: dict[str, Any] = {"variant": name, **exported}
        if exported["exit"] == 0:
            with edgeinfer.load(out, threads=1) as model:
                ours = {p: model.detect(str(p))[0] for p in split["gate"]}
                wanted = sum(len(t) for t in theirs.values())
                found = sum(len(o) for o in ours.values())
                hits = sum(_matched(ours[p], theirs[p]) for p in split["gate"])
                ms, their_ms = _median_ms(lambda p: model.detect(str(p)), split["gate"],
                                          lambda p: theirs_model.detect(str(p)))  # fmt: skip
                manifest = model.manifest
            row.update(theirs=wanted, ours=found, matched=hits, extra=found - hits,
                       ms=round(ms, 2), their_ms=round(their_ms, 2),
                       precision=manifest.precision, io=manifest.io.outputs[0].shape)  # fmt: skip
        rows.append(row)
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"load": load, "rows": rows}, indent=2, default=str))
        return 0
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for row in rows:
        report = row["report"]
        print(f"\n{row['variant']}\n  {row['command']}\n  exit {row['exit']} {row['error']}")
        if row["exit"] == 0:
            print(f"  shipped {report['chosen']} ({row['precision']}), output {row['io']}")
            print(
                f"  NudeNet {row['theirs']} detections on {len(split['gate'])} unseen photos; "
                f"package {row['ours']}, {row['matched']} matched, {row['extra']} not NudeNet's"
            )
            print(f"  detect() {row['ms']} ms vs NudeNet's {row['their_ms']} ms (medians)")
            for variant, entry in report["variants"].items():
                print(
                    f"  {variant}: {entry['accuracy']['summary']} "
                    f"[{entry['accuracy'].get('decided_by')}]"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
