"""``edgeinfer serve PKG [PKG...] --broker mqtt://HOST:PORT``: serve packages over MQTT.

Each package is served under its folder name (``edgeinfer/DEVICE/<folder>/req``). The command runs
until SIGINT or SIGTERM, then finishes queued requests, marks itself offline and exits 0.
"""

from __future__ import annotations

import signal
import socket
import threading
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from edgeinfer.cli.common import (
    MqttPassword,
    MqttPasswordFile,
    MqttUsername,
    broker_password,
    console,
)

__all__ = ["serve"]


class ProtocolChoice(str, Enum):
    v5 = "5"
    v311 = "3.1.1"


def serve(
    packages: Annotated[list[Path], typer.Argument(help="package folders to serve")],
    broker: Annotated[
        str, typer.Option(help="mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS")
    ] = "mqtt://127.0.0.1:1883",
    device_id: Annotated[
        str | None, typer.Option(help="the device's topic level (default: the host name)")
    ] = None,
    topic_prefix: Annotated[str, typer.Option(help="first topic level")] = "edgeinfer",
    shared_group: Annotated[
        str | None, typer.Option(help="subscribe via $share/NAME/... to split load with peers")
    ] = None,
    client_id: Annotated[
        str | None, typer.Option(help="MQTT client id; names the persistent session")
    ] = None,
    protocol: Annotated[ProtocolChoice, typer.Option(help="MQTT version")] = ProtocolChoice.v5,
    qos: Annotated[int, typer.Option(help="QoS of requests and replies (0 or 1)")] = 1,
    max_queue: Annotated[int, typer.Option(help="waiting requests; more get 'busy'")] = 64,
    max_payload_bytes: Annotated[
        int, typer.Option(help="larger requests get 'payload_too_large'")
    ] = 256 * 1024,
    username: MqttUsername = None,
    password: MqttPassword = None,
    password_file: MqttPasswordFile = None,
    tls_ca: Annotated[Path | None, typer.Option(help="CA file that signed the broker")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="client certificate")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="client certificate's key")] = None,
    metrics_interval_s: Annotated[
        float, typer.Option(help="seconds between metrics messages (0: none)")
    ] = 10.0,
    threads: Annotated[int | None, typer.Option(help="intra-op threads per model")] = None,
    cache: Annotated[
        bool, typer.Option(help="answer repeated requests from the result cache (memory + SQLite)")
    ] = False,
    cache_dir: Annotated[
        Path | None, typer.Option(help="where the persistent cache lives (default: per user)")
    ] = None,
    reply_cache_mb: Annotated[
        int | None,
        typer.Option(
            help="answer repeated inputs from memory without the worker (default: "
            "64 with --cache, else 0)"
        ),
    ] = None,
    max_generate_queue: Annotated[
        int, typer.Option(help="generations waiting per generate model; more get 'busy'")
    ] = 4,
    max_generations: Annotated[
        int | None,
        typer.Option(
            help="generations decoded together per generate model (continuous batching; "
            "default: two per core, at most 8)",
            min=1,
        ),
    ] = None,
    kv_budget_mb: Annotated[
        int | None,
        typer.Option(
            help="KV cache the generations of one model may need together (MiB); a "
            "generation waits until its prompt + max_new_tokens fit",
            min=1,
        ),
    ] = None,
    file_backed_prepacks: Annotated[
        bool,
        typer.Option(
            "--file-backed-prepacks",
            help="keep onnxruntime's prepacked weights in a file made on the first load "
            "(~2x the weights on disk): under a memory limit they are evicted and re-read, so "
            "the process slows down where it would be OOM-killed",
        ),
    ] = False,
    memory_budget_mb: Annotated[
        int | None,
        typer.Option(
            help="memory generations may grow into (MiB; default: the cgroup's limit); a "
            "request whose KV would not fit is refused with memory_budget",
            min=1,
        ),
    ] = None,
    reply_topic: Annotated[
        list[str] | None,
        typer.Option(
            help="topic filter replies may go to (repeatable; default P/D/reply/# and "
            "P/clients/+/reply); the bridge's own and request topics are always refused"
        ),
    ] = None,
    availability: Annotated[
        bool,
        typer.Option(
            "--availability",
            help="also keep P/D/availability: retained plain online/offline with its own "
            "Last Will (Home Assistant, Node-RED)",
        ),
    ] = False,
    ha_discovery: Annotated[
        str | None,
        typer.Option(
            help="publish Home Assistant MQTT discovery configs under this prefix "
            "(Home Assistant's default: homeassistant)"
        ),
    ] = None,
    deploy_dir: Annotated[
        Path | None,
        typer.Option(help="take signed packages over MQTT (edgeinfer deploy); kept here"),
    ] = None,
    trusted_key: Annotated[
        list[Path] | None,
        typer.Option(help="public key (edgeinfer keygen's .pub) whose deploys are accepted"),
    ] = None,
    revoked: Annotated[
        Path | None,
        typer.Option(help="file of revoked key ids (one a line): their signatures are refused"),
    ] = None,
    compatible: Annotated[
        list[str] | None,
        typer.Option(help="device class(es) this device takes releases for (sign --compatible)"),
    ] = None,
) -> None:
    """Serve model packages to MQTT devices: request/response with deadlines."""
    import edgeinfer
    from edgeinfer.bridge import Bridge, BridgeConfig, Connection, default_client_id
    from edgeinfer.errors import BrokerAuthError, BrokerUnavailableError, ConfigError

    device = device_id or socket.gethostname().split(".")[0]
    connection = Connection(
        broker=broker,
        client_id=client_id or default_client_id(device, shared_group),
        protocol=protocol.value,
        username=username,
        password=broker_password(password=password, password_file=password_file),
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )
    config = BridgeConfig(
        connection=connection,
        device_id=device,
        topic_prefix=topic_prefix,
        shared_group=shared_group,
        qos=qos,
        max_queue=max_queue,
        max_payload_bytes=max_payload_bytes,
        metrics_interval_s=metrics_interval_s,
        reply_cache_bytes=(reply_cache_mb if reply_cache_mb is not None else 64 * cache) << 20,
        max_generate_queue=max_generate_queue,
        max_generations=max_generations,
        reply_topics=tuple(reply_topic or ()),
        availability=availability,
        ha_discovery_prefix=ha_discovery,
    )
    names = [p.resolve().name for p in packages]
    if len(set(names)) != len(names):
        raise ConfigError(f"two packages share a folder name (the topic level): {names}")
    # Several spinning sessions in one process fight for the cores: spin only with one model.
    runtime = edgeinfer.RuntimeConfig(
        spin_wait=len(packages) == 1,
        file_backed_prepacks=file_backed_prepacks,
        memory_budget_bytes=None if memory_budget_mb is None else memory_budget_mb << 20,
    )
    cache_config = edgeinfer.CacheConfig(directory=cache_dir) if cache else None

    def load(path: Path) -> Any:
        manifest = edgeinfer.Manifest.read(path)
        cached = cache_config if manifest.task in ("embed", "classify") else None  # text only
        return edgeinfer.load(
            path,
            threads=threads,
            config=runtime,
            cache=cached,
            continuous_batching=generations_for(manifest, config.generations, kv_budget_mb),
        )

    models: dict[str, Any] = {name: load(path) for name, path in zip(names, packages, strict=True)}
    deploy = None
    if deploy_dir is not None:
        from edgeinfer.bridge import DeployConfig, TrustedKeys
        from edgeinfer.bridge.ota.signing import read_revoked

        if not trusted_key:
            raise ConfigError("--deploy-dir needs at least one --trusted-key (a .pub file)")
        trusted = TrustedKeys.load(
            trusted_key, revoked=read_revoked(revoked) if revoked else frozenset()
        )
        deploy = DeployConfig(
            folder=deploy_dir, trusted=trusted, loader=load, compatible=tuple(compatible or ())
        )
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    bridge = Bridge(
        models, config=config, deploy=deploy, origins=dict(zip(names, packages, strict=True))
    )
    if bridge.deployer is not None:  # what was deployed before a restart is served again
        for name, model in bridge.deployer.restore().items():
            bridge.models.swap(name, model)
    try:
        bridge.start(timeout_s=None)
        try:
            bridge.wait_ready(timeout_s=30)
        except BrokerUnavailableError:  # keep trying: the broker may come up after us (boot order)
            console.print(f"[yellow]{broker} not reachable yet; retrying in the background[/]")
        console.print(
            f"serving {', '.join(names)} on {broker} as {config.base}/<model>/req "
            f"(client id {connection.client_id}); Ctrl-C to stop"
        )
        while not stop.wait(0.5):
            if bridge.refused is not None:
                raise BrokerAuthError(f"the broker refused the bridge: {bridge.refused}")
    finally:
        bridge.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("stopped")


def generations_for(manifest: Any, generations: int, kv_budget_mb: int | None) -> Any:
    """The continuous batching a generate package is served with: ``generations`` slots
    (within ``kv_budget_mb`` of KV) when its graph can batch and more than one is asked for,
    else ``None`` (one at a time)."""
    import logging

    from edgeinfer.config import ContinuousBatchConfig
    from edgeinfer.package_io import DecoderIO

    if manifest.task != "generate" or generations < 2:
        return None
    if not manifest.io_as(DecoderIO).extra_row_input:
        logging.getLogger(__name__).warning(
            "%s decodes one generation at a time (exported before continuous batching); "
            "re-export it to serve %d at once",
            manifest.name,
            generations,
        )
        return None
    budget = None if kv_budget_mb is None else kv_budget_mb << 20
    return ContinuousBatchConfig(max_sequences=generations, kv_budget_bytes=budget)
