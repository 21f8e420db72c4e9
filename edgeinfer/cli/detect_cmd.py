"""``edgeinfer detect PKG --image PHOTO``: the objects a detector package finds in a picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import print_json

__all__ = ["detect"]


def detect(
    package: Annotated[Path, typer.Argument(help="detector package folder")],
    image: Annotated[Path, typer.Option(help="an image file (.jpg, .png, ...)")],
    score_threshold: Annotated[
        float | None,
        typer.Option(help="keep detections scoring at least this (default: the package's)"),
    ] = None,
    threads: Annotated[int | None, typer.Option(help="intra-op threads (default: all)")] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="print the detections as JSON")
    ] = False,
) -> None:
    """Detect objects in an image; print label, score and box (x1, y1, x2, y2 in the image's
    pixels), best first."""
    from edgeinfer.runtime.kinds.detect import DetectModel

    with DetectModel.load(package, threads=threads) as model:
        (found,) = model.detect(str(image), score_threshold=score_threshold)
    rows = [
        {"label": d.label, "score": round(d.score, 6), "box": [round(v, 2) for v in d.box]}
        for d in found
    ]
    if json_output:
        print_json(rows)
        return
    for row in rows:
        typer.echo(f"{row['label']}\t{row['score']:.4f}\t{row['box']}")
