"""What every subcommand shares: error-to-exit-code mapping, JSON output (``--json``), the
stderr console, sizes (``64KiB``, ``8MiB``, plain bytes) and deprecated spellings. The option
groups of the commands that reach a broker are in ``broker_options.py``. The same thing has the
same flag on every command."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from edgeinfer.errors import (
    AccuracyGateError,
    BrokerAuthError,
    ConfigError,
    EdgeInferError,
    EpCoverageError,
    SlowerQuantizationError,
)

__all__ = [
    "EXIT_CHECK_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "JsonOut",
    "aliased",
    "console",
    "debugging",
    "deprecated",
    "parse_size",
    "print_json",
    "run_guarded",
    "size_option",
]

_OUTPUT = "Output"  # the help's panel of --json, the same on every command
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
# Progress and messages go to stderr, so that --json output on stdout stays machine-readable.
# Into a file or a pipe nothing wraps: a long path must not split "3 entries" over two lines.
_TERMINAL = sys.stderr.isatty()
console = Console(
    stderr=True, highlight=False, width=None if _TERMINAL else 120, soft_wrap=not _TERMINAL
)
_CHECK_FAILURES = (AccuracyGateError, SlowerQuantizationError, EpCoverageError)
_AUTH_HINT = (
    "; check --username and --password-file (or EDGEINFER_MQTT_USERNAME and "
    "EDGEINFER_MQTT_PASSWORD / EDGEINFER_MQTT_PASSWORD_FILE)"
)


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
        hint = _AUTH_HINT if isinstance(exc, BrokerAuthError) else ""
        console.print(f"[bold red]error[/] ({exc.code}): {exc}{hint}")
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


# -- sizes -----------------------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"\s*(\d{1,19})\s*([A-Za-z]*)\s*")
_MAX_SIZE = 1 << 62  # far above any memory or disk; a bigger number is a typo


def parse_size(text: str | int) -> int:
    """Bytes from ``64KiB``, ``8MiB``, ``2GiB`` or plain bytes (``65536``); units are binary
    and their case does not matter. Anything else is a ``ValueError`` that says what is
    accepted (typer turns it into a usage error, exit 2). An ``int`` is bytes already (typer
    passes an option's default through here too)."""
    if isinstance(text, int):
        return text
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; write e.g. 65536, 64KiB, 8MiB or 2GiB")
    size = int(match.group(1)) * _UNITS[unit]
    if size > _MAX_SIZE:
        raise ValueError(f"{text!r} is larger than {_MAX_SIZE} bytes")
    return size


def size_option(name: str, *, help: str, **kwargs: Any) -> Any:
    """A ``typer.Option`` that reads a size (``parse_size``), shown as ``SIZE``."""
    return typer.Option(name, parser=parse_size, metavar="SIZE", help=help, **kwargs)


# -- deprecated spellings ----------------------------------------------------------------------
def deprecated(old: str, *, instead: str, **kwargs: Any) -> Any:
    """A hidden ``typer.Option`` for an old spelling: it still works and warns on stderr that
    ``instead`` is the spelling to use (``kwargs`` go to ``typer.Option``, e.g. a parser)."""

    def warn(value: Any) -> Any:
        if value is not None and value is not False:
            console.print(f"[yellow]warning[/]: {old} is deprecated; use {instead}")
        return value

    return typer.Option(old, hidden=True, show_default=False, callback=warn, **kwargs)


T = TypeVar("T")


def aliased(value: T, old: T | None, *, default: T, names: str) -> T:
    """The value of an option that has a deprecated spelling: the old one's when only it was
    given; both given is a ``ConfigError`` (``names``: "NEW / OLD", for the message)."""
    if old is None:
        return value
    if value != default:
        raise ConfigError(f"{names} are one option in two spellings; give one")
    return old


# -- the option group of every command that prints a result ----------------------------------
JsonOut = Annotated[
    bool,
    typer.Option("--json", help="print the result as JSON on stdout", rich_help_panel=_OUTPUT),
]
