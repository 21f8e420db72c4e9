"""What every subcommand shares: error-to-exit-code mapping, JSON output, the stderr console."""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
from typing import Any

import typer
from rich.console import Console

from edgeinfer.errors import (
    AccuracyGateError,
    EdgeInferError,
    EpCoverageError,
    SlowerQuantizationError,
)

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "console",
    "debugging",
    "print_json",
    "run_guarded",
]

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
# Progress and messages go to stderr, so that --json output on stdout stays machine-readable.
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
_CHECK_FAILURES = (AccuracyGateError, SlowerQuantizationError, EpCoverageError)


def print_json(data: Any) -> None:
    """Write ``data`` to stdout as indented JSON."""
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def debugging(argv: list[str]) -> bool:
    """Whether to show tracebacks: ``--debug`` before the subcommand, or EDGEINFER_DEBUG=1."""
    leading = itertools.takewhile(lambda arg: arg.startswith("-"), argv)
    return "--debug" in leading or os.environ.get("EDGEINFER_DEBUG", "") not in ("", "0")


def run_guarded(app: typer.Typer, argv: list[str]) -> int:
    """Run ``app``; map edgeinfer errors to exit codes with a one-line message (and the
    traceback with ``--debug``)."""
    debug = debugging(argv)
    level = logging.DEBUG if debug else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        # Without standalone mode a typer.Exit raised by a command comes back as its code.
        code = app(args=argv, prog_name="edgeinfer", standalone_mode=False)
    except EdgeInferError as exc:
        if debug:
            console.print_exception()
        console.print(f"[bold red]error[/] ({exc.code}): {exc}")
        return EXIT_CHECK_FAILED if isinstance(exc, _CHECK_FAILURES) else EXIT_USAGE
    except typer.Exit as exc:
        return int(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        console.print("[bold red]aborted[/]")
        return EXIT_USAGE
    except typer.TyperException as exc:  # usage errors: bad option, missing argument
        exc.show()  # type: ignore[attr-defined]  # every usage error is a ClickException
        return EXIT_USAGE
    except Exception as exc:  # a bug: say so plainly, with the type, and keep the exit code
        if debug:
            console.print_exception()
        hint = "" if debug else " (rerun with --debug or EDGEINFER_DEBUG=1 for the traceback)"
        console.print(f"[bold red]internal error[/]: {type(exc).__name__}: {exc}{hint}")
        return EXIT_USAGE
    return code if isinstance(code, int) else EXIT_OK
