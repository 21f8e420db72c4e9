"""What every subcommand shares: error-to-exit-code mapping, JSON output, the stderr console,
sizes (``64KiB``, ``8MiB``, plain bytes), deprecated spellings, and the option groups of the
commands that reach a broker (serve, request, deploy, rollback, fleet): broker, TLS,
credentials, output. The same thing has the same flag on every command."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

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

if TYPE_CHECKING:
    from edgeinfer.bridge.connection import Connection

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_BROKER",
    "EXIT_CHECK_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Broker",
    "ClientId",
    "ConnectTimeout",
    "DeviceId",
    "JsonOut",
    "MqttPassword",
    "MqttPasswordFile",
    "MqttProtocol",
    "MqttUsername",
    "Protocol",
    "TlsCa",
    "TlsCert",
    "TlsKey",
    "TopicPrefix",
    "aliased",
    "broker_connection",
    "broker_password",
    "console",
    "debugging",
    "deprecated",
    "parse_size",
    "print_json",
    "run_guarded",
    "size_option",
]

log = logging.getLogger(__name__)

# The help's option groups (typer panels), the same on every command.
_BROKER, _TLS, _CREDENTIALS, _OUTPUT = "Broker", "TLS", "Credentials", "Output"
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
    str | None,
    typer.Option(
        "--username",
        envvar="EDGEINFER_MQTT_USERNAME",
        help="broker user",
        rich_help_panel=_CREDENTIALS,
    ),
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
        rich_help_panel=_CREDENTIALS,
    ),
]
MqttPasswordFile = Annotated[
    Path | None,
    typer.Option(
        "--password-file",
        envvar="EDGEINFER_MQTT_PASSWORD_FILE",
        help="a file whose first line is the broker password (mode 0600)",
        rich_help_panel=_CREDENTIALS,
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


# -- the option groups of every command that reaches a broker ----------------------------------
DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
CONNECT_TIMEOUT_S = 10.0  # a broker on the LAN answers in milliseconds; 10 s covers a slow TLS


class MqttProtocol(str, Enum):
    """The MQTT version a command speaks (``--protocol``)."""

    v5 = "5"
    v311 = "3.1.1"


Broker = Annotated[
    str,
    typer.Option(
        "--broker", help="mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS", rich_help_panel=_BROKER
    ),
]
DeviceId = Annotated[
    str | None,
    typer.Option(
        "--device-id",
        help="the device's topic level (its bridge's --device-id; default: the host name)",
        rich_help_panel=_BROKER,
    ),
]
TopicPrefix = Annotated[
    str, typer.Option("--topic-prefix", help="first topic level", rich_help_panel=_BROKER)
]
ClientId = Annotated[
    str | None,
    typer.Option(
        "--client-id",
        help="MQTT client id; names the persistent session (default: made from the host)",
        rich_help_panel=_BROKER,
    ),
]
Protocol = Annotated[
    MqttProtocol, typer.Option("--protocol", help="MQTT version", rich_help_panel=_BROKER)
]
# One connect timeout for every command that reaches a broker: a dead broker fails the command
# within it (``broker_unavailable``, exit 2) instead of after the command's whole wait.
ConnectTimeout = Annotated[
    float,
    typer.Option(
        "--connect-timeout-s",
        help="seconds to wait for the broker connection before giving up",
        rich_help_panel=_BROKER,
    ),
]
TlsCa = Annotated[
    Path | None,
    typer.Option("--tls-ca", help="CA file that signed the broker", rich_help_panel=_TLS),
]
TlsCert = Annotated[
    Path | None,
    typer.Option("--tls-cert", help="client certificate (with --tls-key)", rich_help_panel=_TLS),
]
TlsKey = Annotated[
    Path | None,
    typer.Option("--tls-key", help="client certificate's key", rich_help_panel=_TLS),
]
JsonOut = Annotated[
    bool,
    typer.Option("--json", help="print the result as JSON on stdout", rich_help_panel=_OUTPUT),
]


def broker_connection(
    options: Mapping[str, Any],
    *,
    client_id: str,
    protocol: MqttProtocol | None = None,
    session_expiry_s: int | None = None,
) -> Connection:
    """The ``Connection`` a command's broker, TLS and credential options describe.

    Args:
        options: the command's parameters by name (``ctx.params``): ``broker``, ``protocol``,
            ``username``, ``password``, ``password_file``, ``tls_ca``, ``tls_cert``,
            ``tls_key`` as the option groups above declare them.
        client_id: the command's client id (``--client-id`` or one made for the command).
        protocol: instead of ``options["protocol"]`` (a deprecated spelling was resolved).
        session_expiry_s: how long the broker keeps the session (``None``: the default).
    """
    from edgeinfer.bridge.connection import Connection

    connection = Connection(
        broker=options["broker"],
        client_id=client_id,
        protocol=(protocol or options["protocol"]).value,
        username=options["username"],
        password=broker_password(
            password=options["password"], password_file=options["password_file"]
        ),
        tls_ca=options["tls_ca"],
        tls_cert=options["tls_cert"],
        tls_key=options["tls_key"],
    )
    if session_expiry_s is None:
        return connection
    return dataclasses.replace(connection, session_expiry_s=session_expiry_s)
