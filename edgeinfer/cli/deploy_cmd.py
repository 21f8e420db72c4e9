"""``edgeinfer deploy PKG`` and ``edgeinfer rollback NAME``: packages to devices over MQTT.

``deploy`` sends a signed release (``edgeinfer sign --device``) to the bridge of
``--device-id`` in chunks (QoS 1, each with its sha256; a second run after a broken one sends
only what the device lacks) and waits until the device checked the release (version, device,
name, target, expiry), verified, loaded, warmed and smoke-checked it and serves it.
``rollback --key KEY`` sends a signed order to serve the package kept from before. Exit 0
when the device serves the package, 1 when it refused it (the reason is printed), 2 on a
usage or connection problem or no answer in time.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from edgeinfer.cli.common import (
    CONNECT_TIMEOUT_S,
    EXIT_CHECK_FAILED,
    ConnectTimeout,
    MqttPassword,
    MqttPasswordFile,
    MqttUsername,
    broker_password,
    console,
    print_json,
)

__all__ = ["deploy", "rollback"]

Broker = Annotated[str, typer.Option(help="mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS")]
Device = Annotated[str, typer.Option(help="the device's topic level (its bridge's --device-id)")]
Prefix = Annotated[str, typer.Option(help="first topic level")]
TlsCa = Annotated[Path | None, typer.Option(help="CA file that signed the broker")]
Timeout = Annotated[float, typer.Option(help="seconds to wait for the device's final answer")]
JsonOut = Annotated[bool, typer.Option("--json", help="print the device's status as JSON")]


def _connection(
    broker: str,
    device_id: str,
    username: str | None,
    password: str | None,
    password_file: Path | None,
    tls_ca: Path | None,
) -> Any:
    from edgeinfer.bridge import Connection

    # Stable per device: a re-run resumes the same persistent session (queued chunks kept).
    client_id = f"edgeinfer-deploy-{socket.gethostname()}-{device_id}"[:128]
    return Connection(
        broker=broker,
        client_id=client_id,
        username=username,
        password=broker_password(password=password, password_file=password_file),
        tls_ca=tls_ca,
        session_expiry_s=600,
    )


def _report(outcome: Any, json_out: bool) -> None:
    if json_out:
        print_json(
            {
                **outcome.status,
                "chunks_sent": outcome.chunks_sent,
                "chunks_total": outcome.chunks_total,
            }
        )
    if outcome.ok:
        console.print(
            f"{outcome.status.get('name')}: {outcome.status['state']} "
            f"(digest {str(outcome.status.get('digest'))[:16]}, signer "
            f"{outcome.status.get('signer')}; {outcome.chunks_sent} chunk(s) sent)"
        )
        return
    status = outcome.status
    console.print(
        f"[bold red]{status.get('state')}[/] ({status.get('reason')}): {status.get('message')}"
    )
    raise typer.Exit(EXIT_CHECK_FAILED)


def deploy(
    package: Annotated[Path, typer.Argument(help="a signed package folder")],
    device_id: Device,
    broker: Broker = "mqtt://127.0.0.1:1883",
    as_name: Annotated[
        str | None,
        typer.Option("--as", help="serve it under this name (default: the signed name)"),
    ] = None,
    topic_prefix: Prefix = "edgeinfer",
    chunk_kib: Annotated[int, typer.Option(help="chunk size in KiB")] = 256,
    username: MqttUsername = None,
    password: MqttPassword = None,
    password_file: MqttPasswordFile = None,
    tls_ca: TlsCa = None,
    timeout_s: Timeout = 600.0,
    connect_timeout_s: ConnectTimeout = CONNECT_TIMEOUT_S,
    json_out: JsonOut = False,
) -> None:
    """Deploy a signed package to a device's bridge over MQTT."""
    from edgeinfer.bridge import deploy_package

    outcome = deploy_package(
        package,
        connection=_connection(broker, device_id, username, password, password_file, tls_ca),
        device_id=device_id,
        topic_prefix=topic_prefix,
        name=as_name,
        chunk_bytes=chunk_kib * 1024,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
    )
    _report(outcome, json_out)


def rollback(
    name: Annotated[str, typer.Argument(help="the served name to roll back")],
    device_id: Device,
    key: Annotated[Path, typer.Option(help="private key that signs the rollback order")],
    broker: Broker = "mqtt://127.0.0.1:1883",
    to_digest: Annotated[
        str | None,
        typer.Option(help="the package to go back to (default: the device's 'previous')"),
    ] = None,
    to_version: Annotated[int | None, typer.Option(help="or: its release version")] = None,
    expires_in_s: Annotated[
        float,
        typer.Option(help="the device refuses the order after this long (900: it is sent at once)"),
    ] = 900.0,
    topic_prefix: Prefix = "edgeinfer",
    username: MqttUsername = None,
    password: MqttPassword = None,
    password_file: MqttPasswordFile = None,
    tls_ca: TlsCa = None,
    timeout_s: Timeout = 300.0,
    connect_timeout_s: ConnectTimeout = CONNECT_TIMEOUT_S,
    json_out: JsonOut = False,
) -> None:
    """Make a device serve NAME's previous package again (a signed order)."""
    from edgeinfer.bridge import rollback_package

    outcome = rollback_package(
        name,
        connection=_connection(broker, device_id, username, password, password_file, tls_ca),
        device_id=device_id,
        key=key,
        topic_prefix=topic_prefix,
        to_digest=to_digest,
        to_version=to_version,
        expires_in_s=expires_in_s,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
    )
    _report(outcome, json_out)
