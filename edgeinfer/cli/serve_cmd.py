"""``edgeinfer serve PKG [PKG...] --broker mqtt://HOST:PORT``: serve packages over MQTT.

Each package is served under its folder name (``edgeinfer/DEVICE/<folder>/req``). The command runs
until SIGINT or SIGTERM, then finishes queued requests, marks itself offline and exits 0.
"""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from edgeinfer.cli.common import (
    DEFAULT_BROKER,
    Broker,
    ClientId,
    DeviceId,
    MqttPassword,
    MqttPasswordFile,
    MqttProtocol,
    MqttUsername,
    Protocol,
    TlsCa,
    TlsCert,
    TlsKey,
    TopicPrefix,
    aliased,
    broker_connection,
    console,
    deprecated,
    size_option,
)
from edgeinfer.config import DEFAULT_RUN_TIMEOUT_S

__all__ = ["serve"]

DEFAULT_MAX_PAYLOAD_BYTES = 256 << 10  # a batch of texts or a camera frame, not a model


def serve(
    ctx: typer.Context,
    packages: Annotated[list[Path], typer.Argument(help="package folders to serve")],
    broker: Broker = DEFAULT_BROKER,
    device_id: DeviceId = None,
    topic_prefix: TopicPrefix = "edgeinfer",
    shared_group: Annotated[
        str | None, typer.Option(help="subscribe via $share/NAME/... to split load with peers")
    ] = None,
    client_id: ClientId = None,
    protocol: Protocol = MqttProtocol.v5,
    qos: Annotated[int, typer.Option(help="QoS of requests and replies (0 or 1)")] = 1,
    max_queue: Annotated[int, typer.Option(help="waiting requests; more get 'busy'")] = 64,
    max_payload: Annotated[
        int, size_option("--max-payload", help="larger requests get 'payload_too_large'")
    ] = DEFAULT_MAX_PAYLOAD_BYTES,
    username: MqttUsername = None,
    password: MqttPassword = None,
    password_file: MqttPasswordFile = None,
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    metrics_interval_s: Annotated[
        float, typer.Option(help="seconds between metrics messages (0: none)")
    ] = 10.0,
    threads: Annotated[int | None, typer.Option(help="intra-op threads per model")] = None,
    run_timeout: Annotated[
        float,
        typer.Option(
            "--run-timeout",
            help="seconds one graph run may take; a run past it is stopped and its request "
            "answered run_timeout (0: no limit but the request's deadline)",
        ),
    ] = DEFAULT_RUN_TIMEOUT_S,
    cache: Annotated[
        bool, typer.Option(help="answer repeated requests from the result cache (memory + SQLite)")
    ] = False,
    cache_dir: Annotated[
        Path | None, typer.Option(help="where the persistent cache lives (default: per user)")
    ] = None,
    reply_cache: Annotated[
        int | None,
        size_option(
            "--reply-cache",
            help="answer repeated inputs from memory without the worker (default: "
            "64MiB with --cache, else 0)",
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
    kv_budget: Annotated[
        int | None,
        size_option(
            "--kv-budget",
            help="KV cache the generations of one model may need together; a "
            "generation waits until its prompt + max_new_tokens fit",
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
    memory_budget: Annotated[
        int | None,
        size_option(
            "--memory-budget",
            help="memory generations may grow into (default: the cgroup's limit); a "
            "request whose KV would not fit is refused with memory_budget",
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
    max_payload_bytes: Annotated[
        int | None, deprecated("--max-payload-bytes", instead="--max-payload 256KiB")
    ] = None,
    reply_cache_mb: Annotated[
        int | None, deprecated("--reply-cache-mb", instead="--reply-cache 64MiB")
    ] = None,
    kv_budget_mb: Annotated[
        int | None, deprecated("--kv-budget-mb", instead="--kv-budget 512MiB")
    ] = None,
    memory_budget_mb: Annotated[
        int | None, deprecated("--memory-budget-mb", instead="--memory-budget 2GiB")
    ] = None,
) -> None:
    """Serve model packages to MQTT devices: request/response with deadlines."""
    import edgeinfer
    from edgeinfer.bridge import Bridge, BridgeConfig, default_client_id
    from edgeinfer.errors import BrokerAuthError, BrokerUnavailableError, ConfigError

    max_payload = aliased(
        max_payload,
        max_payload_bytes,
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        names="--max-payload / --max-payload-bytes",
    )
    reply_cache = aliased(
        reply_cache, _mib(reply_cache_mb), default=None, names="--reply-cache / --reply-cache-mb"
    )
    kv_budget = aliased(
        kv_budget, _mib(kv_budget_mb), default=None, names="--kv-budget / --kv-budget-mb"
    )
    memory_budget = aliased(
        memory_budget,
        _mib(memory_budget_mb),
        default=None,
        names="--memory-budget / --memory-budget-mb",
    )
    device = device_id or socket.gethostname().split(".")[0]
    connection = broker_connection(
        ctx.params,
        client_id=client_id or default_client_id(device, shared_group),
    )
    config = BridgeConfig(
        connection=connection,
        device_id=device,
        topic_prefix=topic_prefix,
        shared_group=shared_group,
        qos=qos,
        max_queue=max_queue,
        max_payload_bytes=max_payload,
        metrics_interval_s=metrics_interval_s,
        reply_cache_bytes=reply_cache if reply_cache is not None else (64 << 20) * cache,
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
        memory_budget_bytes=memory_budget,
        run_timeout_s=run_timeout or None,
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
            continuous_batching=generations_for(manifest, config.generations, kv_budget),
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


def _mib(value: int | None) -> int | None:
    return None if value is None else value << 20


def generations_for(manifest: Any, generations: int, kv_budget_bytes: int | None) -> Any:
    """The continuous batching a generate package is served with: ``generations`` slots
    (within ``kv_budget_bytes`` of KV) when its graph can batch and more than one is asked for,
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
    return ContinuousBatchConfig(max_sequences=generations, kv_budget_bytes=kv_budget_bytes)
