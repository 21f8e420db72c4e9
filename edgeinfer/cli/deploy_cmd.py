"""``edgeinfer deploy PKG`` and ``edgeinfer rollback NAME``: packages to devices over MQTT.

``deploy`` sends a signed release (``edgeinfer sign --device-id``) to the bridge of
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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from edgeinfer.cli.broker_options import BrokerOptions, broker_options
from edgeinfer.cli.common import (
    EXIT_CHECK_FAILED,
    JsonOut,
    aliased,
    console,
    deprecated,
    print_json,
    size_option,
)

if TYPE_CHECKING:
    from edgeinfer.bridge import Connection

__all__ = ["deploy", "rollback"]

# Required here (a deploy goes to one named device), so not broker_options.DeviceId.
Device = Annotated[
    str,
    typer.Option(
        "--device-id",
        help="the device's topic level (its bridge's --device-id)",
        rich_help_panel="Broker",
    ),
]
Timeout = Annotated[float, typer.Option(help="seconds to wait for the device's final answer")]
DEFAULT_CHUNK_BYTES = 256 << 10  # a few chunks per MiB: a resend after a broken link is cheap


def _connection(mqtt: BrokerOptions, device_id: str) -> Connection:
    # Stable per device: a re-run resumes the same persistent session (queued chunks kept).
    made = f"edgeinfer-deploy-{socket.gethostname()}-{device_id}"[:128]
    return mqtt.connection(default_client_id=made, session_expiry_s=600)


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


@broker_options()
def deploy(
    package: Annotated[Path, typer.Argument(help="a signed package folder")],
    device_id: Device,
    *,
    mqtt: BrokerOptions,
    as_name: Annotated[
        str | None,
        typer.Option("--as", help="serve it under this name (default: the signed name)"),
    ] = None,
    chunk_size: Annotated[int, size_option("--chunk-size", help="bytes per chunk")] = (
        DEFAULT_CHUNK_BYTES
    ),
    timeout_s: Timeout = 600.0,
    json_out: JsonOut = False,
    chunk_kib: Annotated[int | None, deprecated("--chunk-kib", instead="--chunk-size 256KiB")] = (
        None
    ),
) -> None:
    """Deploy a signed package to a device's bridge over MQTT."""
    from edgeinfer.bridge import deploy_package

    chunk_bytes = aliased(
        chunk_size,
        None if chunk_kib is None else chunk_kib << 10,
        default=DEFAULT_CHUNK_BYTES,
        names="--chunk-size / --chunk-kib",
    )
    connection = _connection(mqtt, device_id)
    outcome = deploy_package(
        package,
        connection=connection,
        device_id=device_id,
        topic_prefix=mqtt.topic_prefix,
        name=as_name,
        chunk_bytes=chunk_bytes,
        timeout_s=timeout_s,
        connect_timeout_s=mqtt.connect_timeout_s,
    )
    _report(outcome, json_out)


@broker_options()
def rollback(
    name: Annotated[str, typer.Argument(help="the served name to roll back")],
    device_id: Device,
    key: Annotated[Path, typer.Option(help="private key that signs the rollback order")],
    *,
    mqtt: BrokerOptions,
    to_digest: Annotated[
        str | None,
        typer.Option(help="the package to go back to (default: the device's 'previous')"),
    ] = None,
    to_version: Annotated[int | None, typer.Option(help="or: its release version")] = None,
    expires_in_s: Annotated[
        float,
        typer.Option(help="the device refuses the order after this long (900: it is sent at once)"),
    ] = 900.0,
    timeout_s: Timeout = 300.0,
    json_out: JsonOut = False,
) -> None:
    """Make a device serve NAME's previous package again (a signed order)."""
    from edgeinfer.bridge import rollback_package

    connection = _connection(mqtt, device_id)
    outcome = rollback_package(
        name,
        connection=connection,
        device_id=device_id,
        key=key,
        topic_prefix=mqtt.topic_prefix,
        to_digest=to_digest,
        to_version=to_version,
        expires_in_s=expires_in_s,
        timeout_s=timeout_s,
        connect_timeout_s=mqtt.connect_timeout_s,
    )
    _report(outcome, json_out)
