"""The ``edgeinfer`` command line (typer). Each subcommand imports its backend lazily, so
``edgeinfer inspect`` on a device never imports the export stack.

Exit codes: 0 ok, 1 a check failed (accuracy gate, int8 slower than fp32, bench budget, an
error reply to ``request``), 2 usage, config, connection or internal error.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from edgeinfer.cli import (
    bench_cmd,
    cache_cmd,
    classify_cmd,
    deploy_cmd,
    detect_cmd,
    export_cmd,
    fleet_cmd,
    generate_cmd,
    inspect_cmd,
    profile_cmd,
    request_cmd,
    segment_cmd,
    serve_cmd,
    sign_cmd,
)
from edgeinfer.cli.common import run_guarded

__all__ = ["app", "main"]

app = typer.Typer(
    name="edgeinfer",
    help="Fast, small, reliable inference on edge devices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option("--debug", help="show tracebacks (also EDGEINFER_DEBUG=1)"),
    ] = False,
) -> None:
    """Fast, small, reliable inference on edge devices (``run_guarded`` reads ``--debug``)."""


app.command("export")(export_cmd.export)
app.command("inspect")(inspect_cmd.inspect)
app.command("generate")(generate_cmd.generate)
app.command("classify")(classify_cmd.classify)
app.command("detect")(detect_cmd.detect)
app.command("segment")(segment_cmd.segment)
app.command("serve")(serve_cmd.serve)
app.command("request")(request_cmd.request)
app.command("bench")(bench_cmd.bench)
app.command("profile")(profile_cmd.profile)
app.command("keygen")(sign_cmd.keygen)
app.command("sign")(sign_cmd.sign)
app.command("deploy")(deploy_cmd.deploy)
app.command("rollback")(deploy_cmd.rollback)
app.command("rollout")(fleet_cmd.rollout)
app.add_typer(fleet_cmd.app, name="fleet")
app.add_typer(cache_cmd.app, name="cache")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    return run_guarded(app, sys.argv[1:] if argv is None else argv)
