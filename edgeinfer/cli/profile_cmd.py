"""``edgeinfer profile PKG --text T|--prompt P|--image FILE``: where one request's time goes,
per stage and per graph op type, as a table (or ``--json``), a Chrome trace (``--trace``) and a
flame-style PNG (``--flame``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgeinfer.cli.common import console, print_json

__all__ = ["profile"]


def profile(
    package: Annotated[Path, typer.Argument(help="package folder")],
    text: Annotated[str | None, typer.Option(help="a text to embed or classify")] = None,
    prompt: Annotated[str | None, typer.Option(help="a prompt to complete (generate)")] = None,
    image: Annotated[Path | None, typer.Option(help="an image file to classify")] = None,
    chat: Annotated[
        bool, typer.Option("--chat", help="generate: the prompt as a user message (chat template)")
    ] = False,
    max_new_tokens: Annotated[int, typer.Option(help="generate: new tokens at most")] = 16,
    threads: Annotated[int | None, typer.Option(help="intra-op threads (default: all)")] = None,
    wire: Annotated[
        str,
        typer.Option(
            help="serve it as the MQTT bridge does, payload to reply: json, msgpack; "
            "none: call the model directly"
        ),
    ] = "json",
    batching: Annotated[
        bool, typer.Option("--batching", help="through the dynamic batcher (its queue)")
    ] = False,
    trace: Annotated[
        Path | None, typer.Option(help="write a Chrome trace (chrome://tracing, Perfetto)")
    ] = None,
    flame: Annotated[
        Path | None, typer.Option(help="write a flame-style PNG of the breakdown")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """Run one request twice (warm-up, then measured) with onnxruntime's profiler on and show
    where the measured one spent its time."""
    from edgeinfer.bench.profile import profile as run_profile
    from edgeinfer.bench.profile_views import headline

    result = run_profile(
        package,
        text=text,
        prompt=prompt,
        image=image,
        threads=threads,
        max_new_tokens=max_new_tokens,
        chat=chat,
        wire=None if wire == "none" else wire,
        batching=batching,
    )
    if trace is not None:
        result.write_trace(trace)
    if flame is not None:
        result.write_flame(flame)
    files = {name: str(path) for name, path in (("trace", trace), ("flame", flame)) if path}
    if json_output:
        print_json({**result.to_dict(), **files})
        return
    table = Table(title=headline(result.request, result.total_ms, result.runs))
    for column in ("stage", "ms", "share", "calls"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage in result.stages:
        share = stage.ms / result.total_ms if result.total_ms else 0.0
        table.add_row(stage.name, f"{stage.ms:.3f}", f"{share:.1%}", str(stage.calls))
    console.print(table)
    for key, value in result.detail.items():
        console.print(f"{key}: {value}")
    if trace is not None:
        console.print(f"trace: {trace} (open in chrome://tracing or ui.perfetto.dev)")
    if flame is not None:
        console.print(f"flame: {flame}")
