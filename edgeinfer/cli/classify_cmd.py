"""``edgeinfer classify PKG "text" ...`` (or ``--image PHOTO|FILE.npy``): classify with a
package."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import print_json

__all__ = ["classify"]


def classify(
    package: Annotated[Path, typer.Argument(help="classify package folder")],
    texts: Annotated[list[str] | None, typer.Argument(help="texts to classify")] = None,
    image: Annotated[
        Path | None,
        typer.Option(
            help="an image file (.jpg, .png, ...; resized as the package says) or a .npy array "
            "(uint8 RGB [N, H, W, 3]; early-exit CNNs: intensities in [0, 1])"
        ),
    ] = None,
    exit_threshold: Annotated[
        float | None, typer.Option(help="early exit: threshold of the exit rule")
    ] = None,
    exit_policy: Annotated[
        str | None, typer.Option(help="early exit: max_softmax, entropy or patience")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="intra-op threads (default: all)")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Classify texts (or an image, or the images of a .npy file) and print label, score and
    exit layer."""
    import numpy as np

    from edgeinfer.errors import ConfigError, InputError
    from edgeinfer.runtime.kinds.classify import ClassifyModel
    from edgeinfer.runtime.kinds.early_exit import exit_policy as parse_policy

    if (image is None) == (not texts):
        raise ConfigError("give texts to classify, or --image PHOTO|FILE.npy (not both)")
    policy = None if exit_policy is None else parse_policy(exit_policy)
    model = ClassifyModel.load(package, threads=threads)
    if image is not None and image.suffix != ".npy":
        results = model.classify(str(image), exit_threshold=exit_threshold, exit_policy=policy)
        names = [image.name]
    elif image is not None:
        try:
            inputs = np.load(image, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"{image} is not a readable .npy array: {exc}") from exc
        results = model.classify(inputs, exit_threshold=exit_threshold, exit_policy=policy)
        names = [f"{image.name}[{i}]" for i in range(len(results))]
    else:
        names = list(texts or [])
        results = model.classify(names, exit_threshold=exit_threshold, exit_policy=policy)
    rows = [
        {
            "input": name,
            "label": r.label,
            "score": round(r.score, 6),
            "exit_layer": r.exit_layer,
            "compute_ms": round(r.compute_ms, 3),
        }
        for name, r in zip(names, results, strict=True)
    ]
    if json_output:
        print_json(rows)
        return
    for row in rows:
        exit_note = "" if row["exit_layer"] is None else f"  (exit layer {row['exit_layer']})"
        typer.echo(f"{row['label']}\t{row['score']:.4f}{exit_note}\t{row['input']}")
