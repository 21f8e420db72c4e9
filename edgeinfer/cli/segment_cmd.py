"""``edgeinfer segment PKG --image PHOTO``: the masks a segmenter package finds in a picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import print_json

__all__ = ["segment"]


def segment(
    package: Annotated[Path, typer.Argument(help="segmenter package folder")],
    image: Annotated[Path, typer.Option(help="an image file (.jpg, .png, ...)")],
    threads: Annotated[int | None, typer.Option(help="intra-op threads (default: all)")] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="print the masks as JSON (RLE, docs/mqtt.md)")
    ] = False,
) -> None:
    """Segment an image; print label, score, box (x1, y1, x2, y2 in the image's pixels) and
    mask area per mask, best first (``--json``: each mask as COCO run-length counts over its
    box, from ``offset``)."""
    from edgeinfer.runtime.kinds.segment import SegmentModel

    with SegmentModel.load(package, threads=threads) as model:
        (found,) = model.segment(str(image))
    if json_output:
        print_json([s.to_json() for s in found])
        return
    for s in found:
        box = [round(v, 2) for v in s.box]
        typer.echo(f"{s.label}\t{s.score:.4f}\t{box}\t{s.area} px")
