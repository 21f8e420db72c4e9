"""``edgeinfer generate PKG "prompt"``: text generation with a generate package."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import console, print_json

__all__ = ["generate"]


def generate(
    package: Annotated[Path, typer.Argument(help="generate package folder")],
    prompt: Annotated[str, typer.Argument(help="the prompt (the user message with --chat)")],
    chat: Annotated[
        bool, typer.Option("--chat", help="send the prompt as a user message (chat template)")
    ] = False,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy", min=0.0)] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = off", min=0)] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1 = off")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="seed for reproducible sampling")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="stop string (repeatable)")] = None,
    threads: Annotated[int | None, typer.Option(help="intra-op threads (default: all)")] = None,
    stream: Annotated[bool, typer.Option("--stream", help="print tokens as they come")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Generate a completion (or a chat answer with --chat) and print it."""
    from edgeinfer.config import RuntimeConfig, SamplingConfig
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.generate.chat import Prompt
    from edgeinfer.runtime.generate.generator import Generator

    manifest = Manifest.read(package)
    manifest.verify(package)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    generator = Generator(package, manifest, config=RuntimeConfig(threads=threads))
    request: Prompt = [{"role": "user", "content": prompt}] if chat else prompt
    stops = tuple(stop or ())
    if stream and not json_output:
        chunks = generator.stream(
            request, max_new_tokens=max_new_tokens, sampling=sampling, stop=stops
        )
        for chunk in chunks:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return
    result = generator.generate(
        request, max_new_tokens=max_new_tokens, sampling=sampling, stop=stops
    )
    if json_output:
        print_json(
            {
                "text": result.text,
                "token_ids": list(result.token_ids),
                "prompt_tokens": result.prompt_tokens,
                "finish_reason": result.finish_reason,
                "ttft_ms": round(result.ttft_ms, 3),
                "decode_tokens_per_s": round(result.decode_tokens_per_s, 2),
            }
        )
        return
    typer.echo(result.text)
    console.print(
        f"[dim]{len(result.token_ids)} tokens, {result.finish_reason}, "
        f"TTFT {result.ttft_ms:.0f} ms, {result.decode_tokens_per_s:.1f} tokens/s[/]"
    )
