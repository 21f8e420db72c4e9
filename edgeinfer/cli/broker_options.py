"""The option groups of every command that reaches a broker (serve, request, deploy, rollback,
fleet status, rollout), declared once: ``@broker_options()`` adds the broker, TLS and
credential options to a command in the same spelling and help panels everywhere and hands the
command one ``BrokerOptions``, which builds its ``Connection``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from edgeinfer.errors import ConfigError

if TYPE_CHECKING:
    from edgeinfer.bridge.connection import Connection

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_BROKER",
    "BrokerOptions",
    "DeviceId",
    "MqttProtocol",
    "broker_options",
    "broker_password",
]

log = logging.getLogger(__name__)

DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
CONNECT_TIMEOUT_S = 10.0  # a broker on the LAN answers in milliseconds; 10 s covers a slow TLS
# The help's option groups (typer panels), the same on every command.
_BROKER, _TLS, _CREDENTIALS = "Broker", "TLS", "Credentials"


class MqttProtocol(str, Enum):
    """The MQTT version a command speaks (``--protocol``)."""

    v5 = "5"
    v311 = "3.1.1"


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


# Optional here; deploy and rollback require it, a rollout takes several (their own options).
DeviceId = Annotated[
    str | None,
    typer.Option(
        "--device-id",
        help="the device's topic level (its bridge's --device-id; default: the host name)",
        rich_help_panel=_BROKER,
    ),
]


def _option(name: str, annotation: Any, default: Any, *names: str, **info: Any) -> Any:
    kind = inspect.Parameter.KEYWORD_ONLY
    option = typer.Option(*names, **info)
    return inspect.Parameter(name, kind, default=default, annotation=Annotated[annotation, option])


# The group in help order. A dead broker fails a command within --connect-timeout-s
# (``broker_unavailable``, exit 2) instead of after the command's whole wait.
_GROUP = (
    _option("broker", str, DEFAULT_BROKER, "--broker", rich_help_panel=_BROKER,
            help="mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS"),
    _option("topic_prefix", str, "edgeinfer", "--topic-prefix", rich_help_panel=_BROKER,
            help="first topic level"),
    _option("client_id", str | None, None, "--client-id", rich_help_panel=_BROKER,
            help="MQTT client id; names the persistent session (default: made from the host)"),
    _option("protocol", MqttProtocol, MqttProtocol.v5, "--protocol", rich_help_panel=_BROKER,
            help="MQTT version"),
    _option("connect_timeout_s", float, CONNECT_TIMEOUT_S, "--connect-timeout-s",
            rich_help_panel=_BROKER,
            help="seconds to wait for the broker connection before giving up"),
    _option("username", str | None, None, "--username", envvar="EDGEINFER_MQTT_USERNAME",
            rich_help_panel=_CREDENTIALS, help="broker user"),
    _option("password", str | None, None, "--password", envvar="EDGEINFER_MQTT_PASSWORD",
            show_default=False, callback=_warn_on_command_line, rich_help_panel=_CREDENTIALS,
            help="broker password; prefer EDGEINFER_MQTT_PASSWORD or --password-file (a "
            "command line is visible to every user of the machine)"),
    _option("password_file", Path | None, None, "--password-file",
            envvar="EDGEINFER_MQTT_PASSWORD_FILE", rich_help_panel=_CREDENTIALS,
            help="a file whose first line is the broker password (mode 0600)"),
    _option("tls_ca", Path | None, None, "--tls-ca", rich_help_panel=_TLS,
            help="CA file that signed the broker"),
    _option("tls_cert", Path | None, None, "--tls-cert", rich_help_panel=_TLS,
            help="client certificate (with --tls-key)"),
    _option("tls_key", Path | None, None, "--tls-key", rich_help_panel=_TLS,
            help="client certificate's key"),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class BrokerOptions:
    """A command's broker, TLS and credential options, as ``@broker_options()`` read them."""

    broker: str
    topic_prefix: str
    client_id: str | None
    protocol: MqttProtocol
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    password_file: Path | None
    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None
    connect_timeout_s: float = CONNECT_TIMEOUT_S

    def connection(
        self,
        *,
        default_client_id: str,
        protocol: MqttProtocol | None = None,
        session_expiry_s: int | None = None,
    ) -> Connection:
        """The ``Connection`` these options describe.

        Args:
            default_client_id: the client id when ``--client-id`` was not given.
            protocol: instead of ``--protocol`` (a deprecated spelling was resolved).
            session_expiry_s: how long the broker keeps the session (``None``: the default).
        """
        from edgeinfer.bridge.connection import Connection

        connection = Connection(
            broker=self.broker,
            client_id=self.client_id or default_client_id,
            protocol=(protocol or self.protocol).value,
            username=self.username,
            password=broker_password(password=self.password, password_file=self.password_file),
            tls_ca=self.tls_ca,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
        )
        if session_expiry_s is None:
            return connection
        return dataclasses.replace(connection, session_expiry_s=session_expiry_s)


def broker_options(
    *, connect_timeout: bool = True
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator for a command that takes ``mqtt: BrokerOptions`` (keyword-only): typer
    sees the group's options where ``mqtt`` stands, and the command gets them as one
    ``BrokerOptions``. ``connect_timeout=False`` leaves out ``--connect-timeout-s`` (``serve``
    reconnects for as long as it runs)."""
    group = [p for p in _GROUP if connect_timeout or p.name != "connect_timeout_s"]
    names = [p.name for p in group]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            params.extend(
                group if param.name == "mqtt" else [param.replace(kind=param.KEYWORD_ONLY)]
            )
        if "mqtt" not in signature.parameters:
            raise TypeError(f"{command.__name__} takes no 'mqtt: BrokerOptions' parameter")

        @functools.wraps(command)
        def with_options(**kwargs: Any) -> None:
            mqtt = BrokerOptions(**{name: kwargs.pop(name) for name in names})
            command(mqtt=mqtt, **kwargs)

        # typer reads a command's options from its signature and annotations.
        with_options.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in params}
        return with_options

    return decorate


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
