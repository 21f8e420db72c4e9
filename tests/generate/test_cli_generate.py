"""``edgeinfer generate``: run through the CLI's own error handling on the tiny package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from edgeinfer.cli import generate_cmd
from edgeinfer.cli.common import run_guarded


def cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # a group, so that the command is named as in edgeinfer's app
    app.command("generate")(generate_cmd.generate)
    return app


def test_generate_json_matches_stream(
    tiny_package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "generate",
        str(tiny_package),
        "Hello there",
        "--max-new-tokens",
        "12",
        "--threads",
        "1",
    ]
    assert run_guarded(cli(), [*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["finish_reason"] in ("eos", "length") and result["prompt_tokens"] > 0
    assert run_guarded(cli(), [*args, "--stream"]) == 0
    assert capsys.readouterr().out == result["text"] + "\n"


def test_generate_chat_sampling_and_errors(
    tiny_package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", str(tiny_package), "Hi", "--chat", "--temperature", "0.8", "--top-p", "0.9"]
    seeded = [*args, "--seed", "5", "--max-new-tokens", "8", "--json", "--threads", "1"]
    assert run_guarded(cli(), seeded) == 0
    first = json.loads(capsys.readouterr().out)
    assert run_guarded(cli(), seeded) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["text"], again["token_ids"]) == (first["text"], first["token_ids"])
    too_long = ["generate", str(tiny_package), "Hi", "--max-new-tokens", "100000"]
    assert run_guarded(cli(), too_long) == 2  # ContextLengthExceededError: a usage error
    assert "context_length" in capsys.readouterr().err
