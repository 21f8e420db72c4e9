"""``edgeinfer fleet status`` and ``edgeinfer rollout PKG``: the fleet as the broker shows it,
and one signed release to many devices in waves.

``fleet status`` lists every device under the topic prefix from its retained topics: served
packages (digest, version, signer), compatible classes, health, its last deploy step, last
seen. ``rollout`` deploys in waves and stops itself when too many devices reject the release
on their own traffic; its progress lives in ``--state-dir``, so running the same command again
after the operator machine died resumes it. Exit 0 when every device committed, 1 when the
rollout aborted or some device did not commit, 2 on a usage or connection problem.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from edgeinfer.cli.broker_options import BrokerOptions, broker_options
from edgeinfer.cli.common import EXIT_CHECK_FAILED, JsonOut, console, print_json

__all__ = ["app", "rollout"]

app = typer.Typer(help="The fleet of devices, as the broker shows it.", no_args_is_help=True)


def _connection(mqtt: BrokerOptions, role: str) -> Any:
    # One per run: a rollout's deploys add the device id to it (one session per device).
    made = f"edgeinfer-{role}-{socket.gethostname()}-{os.getpid()}"[:100]
    return mqtt.connection(default_client_id=made)


@app.command("status")
@broker_options()
def status(
    *,
    mqtt: BrokerOptions,
    wait_s: Annotated[float, typer.Option(help="seconds to collect retained statuses")] = 10.0,
    json_out: JsonOut = False,
) -> None:
    """List every device: served packages, versions, signer, class, health, last seen."""
    from edgeinfer.bridge.fleet.inventory import fleet_status

    devices = fleet_status(
        connection=_connection(mqtt, "fleet"),
        topic_prefix=mqtt.topic_prefix,
        wait_s=wait_s,
        connect_timeout_s=mqtt.connect_timeout_s,
    )
    if json_out:
        print_json([d.as_dict() for d in devices])
        return
    from rich.table import Table

    table = Table("device", "health", "class", "model", "version", "digest", "signer", "deploy")
    for d in devices:
        deploy = " ".join(str(d.deploy.get(k)) for k in ("state", "reason") if d.deploy.get(k))
        for name, m in sorted(d.models.items()) or [("-", {})]:
            table.add_row(d.device_id, d.health, ",".join(d.compatible), name,
                          str(m.get("version")), str(m.get("digest"))[:12],
                          str(m.get("signer")), deploy)  # fmt: skip
    console.print(table)
    console.print(f"{len(devices)} device(s)")


@broker_options()
def rollout(
    package: Annotated[Path, typer.Argument(help="a package signed as a release")],
    state_dir: Annotated[Path, typer.Option(help="where the rollout's progress is kept")],
    device_id: Annotated[
        list[str] | None,
        typer.Option("--device-id", help="a device to roll out to (repeatable)"),
    ] = None,
    compatible: Annotated[
        str | None, typer.Option(help="or: every device whose status names this class")
    ] = None,
    start: Annotated[int, typer.Option(help="devices in the first wave")] = 1,
    factor: Annotated[float, typer.Option(help="each wave this many times the last")] = 2.0,
    max_per_minute: Annotated[int, typer.Option(help="deploys begun per minute, at most")] = 60,
    max_failure_share: Annotated[
        float, typer.Option(help="abort once more than this share of done devices failed")
    ] = 0.2,
    min_count: Annotated[int, typer.Option(help="devices done before the abort rule applies")] = 1,
    device_timeout_s: Annotated[
        float, typer.Option(help="seconds a device has to deploy and give its trial's verdict")
    ] = 300.0,
    offline: Annotated[
        str, typer.Option(help="a device offline at its turn: 'wait' (to the end) or 'skip'")
    ] = "wait",
    offline_wait_s: Annotated[
        float, typer.Option(help="how long the end of the rollout waits for offline devices")
    ] = 300.0,
    *,
    mqtt: BrokerOptions,
    json_out: JsonOut = False,
) -> None:
    """Roll a signed release out to many devices in waves, with an abort rule."""
    from edgeinfer.bridge.fleet.rollout import RolloutPlan
    from edgeinfer.bridge.fleet.rollout import rollout as run_rollout

    plan = RolloutPlan(
        devices=tuple(device_id or ()), compatible=compatible, start=start, factor=factor,
        max_per_minute=max_per_minute, max_failure_share=max_failure_share,
        min_count=min_count, device_timeout_s=device_timeout_s, offline=offline,
        offline_wait_s=offline_wait_s,
    )  # fmt: skip
    report = run_rollout(
        package,
        connection=_connection(mqtt, "rollout"),
        state_dir=state_dir,
        plan=plan,
        topic_prefix=mqtt.topic_prefix,
        connect_timeout_s=mqtt.connect_timeout_s,
        on_step=lambda d, step: console.print(f"{d}: {step}"),
    )
    if json_out:
        print_json(report.as_dict())
    else:
        from rich.table import Table

        table = Table("device", "wave", "state", "reason", "serves", "attempts")
        for r in report.devices:
            table.add_row(r.device_id, str(r.wave), r.state, r.reason or "",
                          str(r.serves)[:12], str(r.attempts))  # fmt: skip
        console.print(table)
        console.print(f"rollout of {report.name} {report.release_id}: {report.state} "
                      f"{report.counts()}")  # fmt: skip
    if report.state != "done" or set(report.counts()) - {"committed"}:
        raise typer.Exit(EXIT_CHECK_FAILED)
