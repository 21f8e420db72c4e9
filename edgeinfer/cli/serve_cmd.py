"""``edgeinfer serve PKG [PKG...] --broker mqtt://HOST:PORT``: serve packages over MQTT.

Each package is served under its folder name (``edgeinfer/DEVICE/<folder>/req``). The command runs
until SIGINT or SIGTERM, then finishes queued requests, marks itself offline and exits 0. It only
maps its flags to ``edgeinfer.bridge.ServeSettings``; ``edgeinfer.bridge.Server`` serves.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, fields
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from edgeinfer.cli.broker_options import BrokerOptions, DeviceId, broker_options
from edgeinfer.cli.common import JsonOut, aliased, console, deprecated, size_option
from edgeinfer.config import DEFAULT_RUN_TIMEOUT_S

__all__ = ["serve"]

DEFAULT_MAX_PAYLOAD_BYTES = 256 << 10  # a batch of texts or a camera frame, not a model
_CACHE_REPLIES = 64 << 20  # the reply cache --cache turns on: ~40k MiniLM replies
_DEPLOYS = "Deploys"


@broker_options(connect_timeout=False)
def serve(
    packages: Annotated[list[Path], typer.Argument(help="package folders to serve")],
    device_id: DeviceId = None,
    *,
    mqtt: BrokerOptions,
    shared_group: Annotated[
        str | None, typer.Option(help="subscribe via $share/NAME/... to split load with peers")
    ] = None,
    qos: Annotated[int, typer.Option(help="QoS of requests and replies (0 or 1)")] = 1,
    max_queue: Annotated[int, typer.Option(help="waiting requests; more get 'busy'")] = 64,
    max_payload: Annotated[
        int, size_option("--max-payload", help="larger requests get 'payload_too_large'")
    ] = DEFAULT_MAX_PAYLOAD_BYTES,
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
        typer.Option(
            help="take signed packages over MQTT (edgeinfer deploy); kept here",
            rich_help_panel=_DEPLOYS,
        ),
    ] = None,
    trusted_key: Annotated[
        list[Path] | None,
        typer.Option(
            help="public key (edgeinfer keygen's .pub) whose deploys are accepted",
            rich_help_panel=_DEPLOYS,
        ),
    ] = None,
    revoked: Annotated[
        Path | None,
        typer.Option(
            help="file of revoked key ids (one a line): their signatures are refused",
            rich_help_panel=_DEPLOYS,
        ),
    ] = None,
    compatible: Annotated[
        list[str] | None,
        typer.Option(
            help="device class(es) this device takes releases for (sign --compatible)",
            rich_help_panel=_DEPLOYS,
        ),
    ] = None,
    check_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="seconds a deployed package's check (load, warm-up, smoke cases, in a child "
            "process) may take before it is killed and the deploy fails (default: 120)",
            rich_help_panel=_DEPLOYS,
        ),
    ] = None,
    check_memory: Annotated[
        int | None,
        size_option(
            "--check-memory",
            help="data memory that check may use (default: 3/4 of what is available)",
            rich_help_panel=_DEPLOYS,
        ),
    ] = None,
    max_client_requests: Annotated[
        int | None,
        typer.Option(
            help="requests one client (reply address) may have queued or running; one more "
            "gets 'busy' (default: no cap: the queue is already fair per client)",
            min=1,
        ),
    ] = None,
    max_client_generations: Annotated[
        int | None,
        typer.Option(help="the same per generate model, for generations (default: no cap)", min=1),
    ] = None,
    journal_dir: Annotated[
        Path | None,
        typer.Option(
            help="where the request journal lives (a QoS 1 request is acknowledged once "
            "recorded; a killed bridge answers it after a restart; default: "
            "$EDGEINFER_STATE_DIR, else the user's state folder)"
        ),
    ] = None,
    journal_keep_s: Annotated[
        float,
        typer.Option(help="answered requests stay in the journal (duplicates answered) this long"),
    ] = 3600.0,
    json_out: JsonOut = False,
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
    from edgeinfer.bridge import BridgeConfig, DeploySettings, Server, ServeSettings
    from edgeinfer.bridge.serve.settings import default_client_id, default_state_dir
    from edgeinfer.config import CacheConfig

    max_payload = aliased(
        max_payload,
        max_payload_bytes,
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        names="--max-payload / --max-payload-bytes",
    )
    reply_cache = aliased(
        reply_cache, _mib(reply_cache_mb), default=None, names="--reply-cache / --reply-cache-mb"
    )
    device = device_id or socket.gethostname().split(".")[0]
    bridge = BridgeConfig(
        connection=mqtt.connection(default_client_id=default_client_id(device, shared_group)),
        device_id=device,
        topic_prefix=mqtt.topic_prefix,
        shared_group=shared_group,
        qos=qos,
        max_queue=max_queue,
        max_payload_bytes=max_payload,
        metrics_interval_s=metrics_interval_s,
        reply_cache_bytes=reply_cache if reply_cache is not None else _CACHE_REPLIES * cache,
        max_generate_queue=max_generate_queue,
        max_generations=max_generations,
        max_client_requests=max_client_requests,
        max_client_generations=max_client_generations,
        reply_topics=tuple(reply_topic or ()),
        availability=availability,
        ha_discovery_prefix=ha_discovery,
        journal_dir=journal_dir or default_state_dir(),
        journal_keep_s=journal_keep_s,
    )
    deploy = None
    if deploy_dir is not None:
        timeout = {} if check_timeout_s is None else {"check_timeout_s": check_timeout_s}
        deploy = DeploySettings(
            folder=deploy_dir,
            trusted_keys=tuple(trusted_key or ()),
            revoked=revoked,
            compatible=tuple(compatible or ()),
            check_memory_bytes=check_memory,
            **timeout,
        )
    settings = ServeSettings(
        bridge=bridge,
        threads=threads,
        cache=CacheConfig(directory=cache_dir) if cache else None,
        file_backed_prepacks=file_backed_prepacks,
        run_timeout_s=run_timeout or None,
        memory_budget_bytes=aliased(
            memory_budget,
            _mib(memory_budget_mb),
            default=None,
            names="--memory-budget / --memory-budget-mb",
        ),
        kv_budget_bytes=aliased(
            kv_budget, _mib(kv_budget_mb), default=None, names="--kv-budget / --kv-budget-mb"
        ),
        deploy=deploy,
    )
    Server(packages, settings=settings).run(on_ready=partial(_report_ready, json_out=json_out))
    if json_out:
        typer.echo(json.dumps({"state": "stopped"}))
    console.print("stopped")


def _mib(value: int | None) -> int | None:
    return None if value is None else value << 20


def _report_ready(server: Any, *, json_out: bool) -> None:
    """What serves where: a line on stderr; with ``--json``, also one JSON line on stdout
    with the settings the server runs with (no password)."""
    config = server.settings.bridge
    console.print(
        f"serving {', '.join(server.names)} on {config.connection.broker} as "
        f"{config.base}/<model>/req (client id {config.connection.client_id}); Ctrl-C to stop"
    )
    if json_out:
        typer.echo(json.dumps(_ready_report(server), default=str, sort_keys=True))


def _ready_report(server: Any) -> dict[str, Any]:
    settings = server.settings
    bridge = {f.name: getattr(settings.bridge, f.name) for f in fields(settings.bridge)}
    connection = {k: v for k, v in asdict(bridge.pop("connection")).items() if k != "password"}
    report: dict[str, Any] = {
        "state": "serving",
        "models": server.names,
        "base": settings.bridge.base,
        "bridge": {**bridge, "connection": connection},
        "runtime": {
            "threads": settings.threads,
            "cache": settings.cache is not None,
            "file_backed_prepacks": settings.file_backed_prepacks,
            "memory_budget_bytes": settings.memory_budget_bytes,
            "kv_budget_bytes": settings.kv_budget_bytes,
        },
        "deploy": None,
    }
    deploy = server.deploy_config
    if deploy is not None:
        report["deploy"] = {
            "folder": deploy.folder,
            "compatible": list(deploy.compatible),
            "check_timeout_s": deploy.check_timeout_s,
            "check_memory_bytes": deploy.check_memory_bytes,
            "check_load": deploy.check_load.to_json(),
        }
    return report
