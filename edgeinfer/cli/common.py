"""What every subcommand shares: error-to-exit-code mapping, JSON output, the stderr console,
and the broker credential options of the commands that connect (serve, request, deploy,
rollback)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

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
    "MqttPassword",
    "MqttPasswordFile",
    "MqttUsername",
    "broker_password",
    "console",
    "debugging",
    "print_json",
    "run_guarded",
]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
# Progress and messages go to stderr, so that --json output on stdout stays machine-readable.
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 120)
_CHECK_FAILURES = (AccuracyGateError, SlowerQuantizationError, EpCoverageError)
_AUTH_HINT = (
    "; check --username and --password-file (or EDGEINFER_MQTT_USERNAME and "
    "EDGEINFER_MQTT_PASSWORD / EDGEINFER_MQTT_PASSWORD_FILE)"
)


def _warn_on_command_line(
    ctx: typer.Context, param: typer.CallbackParam, value: str | None
) -> str | None:
    """``--password``'s callback: a command line is readable by every user of the machine
    (``ps``, ``/proc/PID/cmdline``), the environment and a file are not."""
    source = ctx.get_parameter_source(param.name or "")
    if value is not None and source is not None and source.name == "COMMANDLINE":
        log.warning(
            "--password on the command line is visible to every user of this machine (ps, "
            "/proc/PID/cmdline); use --password-file FILE or EDGEINFER_MQTT_PASSWORD instead"
        )
    return value


MqttUsername = Annotated[
    str | None, typer.Option("--username", envvar="EDGEINFER_MQTT_USERNAME", help="broker user")
]
MqttPassword = Annotated[
    str | None,
    typer.Option(
        "--password",
        envvar="EDGEINFER_MQTT_PASSWORD",
        show_default=False,
        callback=_warn_on_command_line,
        help="broker password; prefer EDGEINFER_MQTT_PASSWORD or --password-file (a command "
        "line is visible to every user of the machine)",
    ),
]
MqttPasswordFile = Annotated[
    Path | None,
    typer.Option(
        "--password-file",
        envvar="EDGEINFER_MQTT_PASSWORD_FILE",
        help="a file whose first line is the broker password (mode 0600)",
    ),
]


def broker_password(*, password: str | None, password_file: Path | None) -> str | None:
    """The broker password: ``--password`` (or ``EDGEINFER_MQTT_PASSWORD``), else the first
    line of ``--password-file``; both at once is a ``ConfigError`` (which one was meant?)."""
    if password_file is None:
        return password
    if password is not None:
        raise ConfigError(
            "the broker password came twice (--password or EDGEINFER_MQTT_PASSWORD, and "
            "--password-file); give one"
        )
    try:
        text = password_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the password file {password_file}: {exc}") from exc
    secret = text.split("\n", 1)[0].removesuffix("\r")
    if not secret:
        raise ConfigError(f"{password_file} is empty; write the broker password on its first line")
    return secret


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


# One connect timeout for every command that reaches a broker: a dead broker fails the command
# within it (``broker_unavailable``, exit 2) instead of after the command's whole wait.
ConnectTimeout = Annotated[
    float, typer.Option(help="seconds to wait for the broker connection before giving up")
]
CONNECT_TIMEOUT_S = 10.0  # a broker on the LAN answers in milliseconds; 10 s covers a slow TLS
