"""``edgeinfer request --broker mqtt://HOST:PORT MODEL '{json}'``: one request to a bridge.

For devices and scripts: send one request (any kind: docs/mqtt.md) to ``edgeinfer serve`` over
MQTT, wait for its reply, print the reply as JSON on stdout (a generation's chunks go to stderr
as they come): summarized by default (each long list of numbers, an embedding say, on one line
as its length and first values), whole with ``--json``. Exit 0 when the reply says ``ok: true``,
1 on an error reply (``busy``, ``deadline_exceeded``, ``bad_request``, ...), 2 on a usage,
connection or authentication problem, or when no reply came after every re-send
(``request_timeout``).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Annotated, Any

import typer

from edgeinfer.cli.broker_options import BrokerOptions, DeviceId, MqttProtocol, broker_options
from edgeinfer.cli.common import EXIT_CHECK_FAILED, aliased, console, deprecated, print_json

__all__ = ["request"]

# The request fields a caller may put in the JSON argument (``reply_to`` is the client's own).
_FIELDS = ("id", "text", "texts", "params", "timeout_ms", "deadline_ms")
# A list of more numbers than this is summarized unless --json (a MiniLM vector: 384 lines).
_SHOWN_NUMBERS = 8
# Fields of the other request kinds (docs/mqtt.md), passed through as they are.
_KIND_FIELDS = (
    "v", "kind", "encoding", "image", "images", "inputs", "stream", "prompt", "messages",
    "max_new_tokens", "sampling", "stop", "first_token_timeout_ms", "cancel",
)  # fmt: skip


def _parse_body(body: str) -> dict[str, Any]:
    """The JSON argument as a request object, or a ``ConfigError`` saying what is wrong."""
    from edgeinfer.errors import ConfigError

    try:
        data = json.loads(body)
    except ValueError as exc:
        raise ConfigError(f"the request is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError('the request must be a JSON object, e.g. \'{"text": "..."}\'')
    unknown = sorted(set(data) - set(_FIELDS) - set(_KIND_FIELDS))
    if unknown:
        allowed = [*_FIELDS, *_KIND_FIELDS]
        raise ConfigError(f"unknown request field(s) {unknown}; allowed: {allowed}")
    if data.get("id") is not None and not isinstance(data["id"], str):
        raise ConfigError("'id' must be a string")
    return data


def _summary(value: Any) -> Any:
    """``value`` with each list of more than ``_SHOWN_NUMBERS`` numbers replaced by a line
    saying its length and first values (still JSON: the rest of the reply is unchanged)."""
    if isinstance(value, dict):
        return {k: _summary(v) for k, v in value.items()}
    if not isinstance(value, list):
        return value
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if numbers and len(value) > _SHOWN_NUMBERS:
        head = ", ".join(f"{v:.4g}" for v in value[:4])
        return f"{len(value)} numbers [{head}, ...] (--json prints them all)"
    return [_summary(v) for v in value]


@broker_options()
def request(
    model: Annotated[str, typer.Argument(help="the model's topic level (its package folder name)")],
    body: Annotated[
        str,
        typer.Argument(
            help='the request as JSON: {"text": "..."} or {"texts": [...]}, '
            'optional "id", "params", "timeout_ms" or "deadline_ms"'
        ),
    ],
    device_id: DeviceId = None,
    *,
    mqtt: BrokerOptions,
    timeout_s: Annotated[
        float, typer.Option(help="seconds to wait for a reply before re-sending the same id")
    ] = 5.0,
    retries: Annotated[int, typer.Option(help="re-sends (same id) when no reply came")] = 2,
    backoff: Annotated[float, typer.Option(help="each wait is this many times the last")] = 2.0,
    whole: Annotated[
        bool,
        typer.Option(
            "--json", "--full", help="print the whole reply (every vector value), for scripts"
        ),
    ] = False,
    v311: Annotated[bool, deprecated("--v311", instead="--protocol 3.1.1")] = False,
) -> None:
    """Send one request to an ``edgeinfer serve`` bridge and print its reply as JSON."""
    from edgeinfer.bridge import Client
    from edgeinfer.errors import ConfigError

    data = _parse_body(body)
    if timeout_s <= 0 or mqtt.connect_timeout_s <= 0:
        raise ConfigError("--timeout-s and --connect-timeout-s must be > 0")
    device = device_id or socket.gethostname().split(".")[0]
    protocol = aliased(
        mqtt.protocol,
        MqttProtocol.v311 if v311 else None,
        default=MqttProtocol.v5,
        names="--protocol / --v311",
    )
    connection = mqtt.connection(
        default_client_id=f"edgeinfer-request-{socket.gethostname()}-{os.getpid()}"[:128],
        protocol=protocol,
        # Long enough to ride out a broker restart during one request; short, so one-shot
        # clients with per-process ids do not pile up sessions on the broker.
        session_expiry_s=60,
    )
    client = Client(connection=connection, device_id=device, topic_prefix=mqtt.topic_prefix)
    with client.connect(timeout_s=mqtt.connect_timeout_s):
        reply = client.request(
            model,
            text=data.get("text"),
            texts=data.get("texts"),
            request_id=data.get("id"),
            timeout_ms=data.get("timeout_ms"),
            deadline_ms=data.get("deadline_ms"),
            params=data.get("params"),
            fields={k: v for k, v in data.items() if k in _KIND_FIELDS} or None,
            on_chunk=lambda chunk: typer.echo(str(chunk.get("text", "")), err=True, nl=False),
            attempt_timeout_s=timeout_s,
            retries=retries,
            backoff=backoff,
        )
    print_json(reply if whole else _summary(reply))
    if reply.get("ok") is not True:
        error = reply.get("error")
        if not isinstance(error, dict):
            error = {}
        console.print(f"[bold red]error reply[/] ({error.get('code')}): {error.get('message')}")
        raise typer.Exit(EXIT_CHECK_FAILED)
