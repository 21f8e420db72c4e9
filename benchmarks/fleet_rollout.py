"""A twenty-device rollout, end to end, on one machine: the numbers of a staged rollout.

Twenty bridges (in this process: twenty onnxruntime processes would not fit a small machine)
on one mosquitto, each serving a tiny torch-free encoder (tests/fast_packages.py) with live
traffic from four client threads. Then:

1. a release that passes its smoke check but embeds texts with two of its words elsewhere is
   rolled out (``--compatible``, waves of 2, x2): how long each device of the first wave served
   it, which trial signal caught it after how many requests, and the abort;
2. a good release rolled out by ``edgeinfer rollout`` in a subprocess, killed with SIGKILL
   once two devices are done, and run again: deploys per device (from the devices' own
   statuses), none twice, none skipped; one device offline at its turn gets it on return;
3. requests sent, answered and answered twice through all of it.

    PYTHONPATH=. python benchmarks/fleet_rollout.py [--json out.json] [--shadow-share 0.1]
        [--min-shadow 20] [--max-window-s 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny package builders the tests use
sys.path.insert(0, str(ROOT / "tests" / "bridge"))

from fleet_harness import CLASS, NAME, TRIAL, Device, Traffic, releases, summary  # noqa: E402
from mosquitto import Mosquitto  # noqa: E402  (the tests' broker: the fleet test's config)
from paho.mqtt.client import Client as PahoClient  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion  # noqa: E402

from edgeinfer.bridge import Connection  # noqa: E402
from edgeinfer.bridge.fleet.progress import Progress  # noqa: E402
from edgeinfer.bridge.fleet.rollout import RolloutPlan, rollout  # noqa: E402
from edgeinfer.bridge.ota.signing import generate_keypair  # noqa: E402
from edgeinfer.manifest import Manifest  # noqa: E402

FLEET = 20
OFFLINE = "gw-19"


class Statuses:
    """Every deploy status of every device, with the time it came (monotonic s)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("mqtt://").rsplit(":", 1)
        self.seen: list[tuple[float, str, dict[str, Any]]] = []
        ready = threading.Event()
        self.client = PahoClient(CallbackAPIVersion.VERSION2, client_id="bench-statuses",
                                 protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
        self.client.on_connect = lambda c, *a: c.subscribe("edgeinfer/+/ota/status", 1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = lambda c, u, m: self.seen.append(
            (time.monotonic(), m.topic.split("/")[1], json.loads(m.payload))
        )
        self.client.connect(host, int(port))
        self.client.loop_start()
        ready.wait(10)

    def of(self, deploy_id: str) -> list[tuple[float, str, dict[str, Any]]]:
        return [s for s in list(self.seen) if s[2].get("deploy_id") == deploy_id]


def _deploy_id(package: Path) -> str:
    release = json.loads((package / "manifest.sig").read_text())["release"]
    return f"{NAME}-{release['manifest_sha256'][:16]}-v{release['version']}"


def _plan() -> RolloutPlan:
    return RolloutPlan(compatible=CLASS, start=2, factor=2.0, max_failure_share=0.2, min_count=2,
                       device_timeout_s=180.0, offline_wait_s=180.0)  # fmt: skip


def _bad_run(url: str, bad: Path, state_dir: Path, statuses: Statuses) -> dict[str, Any]:
    t0 = time.monotonic()
    report = rollout(bad, connection=Connection(broker=url, client_id="bench-op-bad"),
                     state_dir=state_dir, plan=_plan())  # fmt: skip
    served = {}
    for at, device, status in statuses.of(_deploy_id(bad)):
        if status.get("state") == "trial":
            served.setdefault(device, {})["from"] = at
        elif status.get("state") in ("rolled_back", "committed"):
            trial = status.get("trial") or {}
            served.setdefault(device, {}).update(
                until=at, verdict=status["state"], signal=status.get("reason"),
                requests=trial.get("requests"), shadowed=trial.get("shadowed"),
                agreement=trial.get("agreement"),
                shadow_compute_share=trial.get("shadow_compute_share"),
            )  # fmt: skip
    for seen in served.values():
        seen["served_bad_s"] = round(seen.pop("until", t0) - seen.pop("from", t0), 2)
    return {"seconds": round(time.monotonic() - t0, 1), "report": report.as_dict(),
            "devices_that_served_it": served}  # fmt: skip


def _good_run(url: str, good: Path, state_dir: Path, devices: dict[str, Device],
              statuses: Statuses) -> dict[str, Any]:  # fmt: skip
    t0 = time.monotonic()
    command = [sys.executable, "-m", "edgeinfer", "rollout", str(good), "--state-dir",
               str(state_dir), "--compatible", CLASS, "--start", "2", "--factor", "2",
               "--device-timeout-s", "180", "--broker", url]  # fmt: skip
    operator = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while True:
        progress = Progress(state_dir)
        recorded = progress.rollout(NAME)  # first: the rows read next are this rollout's
        rows = progress.devices(NAME)
        progress.close()
        if recorded and recorded["package"] == str(good) and sum(r.done for r in rows) >= 2:
            break
        time.sleep(0.2)  # polling another process's database
    operator.send_signal(signal.SIGKILL)
    operator.wait(30)
    at_kill = {r.device_id: r.state for r in rows}
    killed_s = time.monotonic() - t0

    def back_when_waiting() -> None:
        while True:
            progress = Progress(state_dir)
            state = {r.device_id: r.state for r in progress.devices(NAME)}.get(OFFLINE)
            progress.close()
            if state == "waiting":
                devices[OFFLINE].start()
                return
            time.sleep(0.2)

    threading.Thread(target=back_when_waiting, daemon=True).start()
    report = rollout(good, connection=Connection(broker=url, client_id="bench-op-good"),
                     state_dir=state_dir, plan=_plan())  # fmt: skip
    deploys = {d: 0 for d in devices}
    for _, device, status in statuses.of(_deploy_id(good)):
        deploys[device] += status.get("state") == "trial"
    digest = Manifest.read(good).digest
    return {
        "seconds": round(time.monotonic() - t0, 1), "killed_after_s": round(killed_s, 1),
        "states_at_kill": at_kill, "report": report.as_dict(),
        "deploys_per_device": deploys,
        "deployed_twice": sorted(d for d, n in deploys.items() if n > 1),
        "skipped": sorted(d for d, n in deploys.items() if n == 0),
        "final_equals_report": all(
            devices[r.device_id].serves() == r.serves == digest for r in report.devices
        ),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--shadow-share", type=float, default=0.1)
    parser.add_argument("--min-shadow", type=int, default=20)
    # Long enough for --min-shadow comparisons at --shadow-share on a loaded machine: a shorter
    # window ends a trial unproven (trial_no_traffic), a rollback for the wrong reason.
    parser.add_argument("--max-window-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    trial = {**TRIAL, "shadow_share": args.shadow_share, "min_shadow": args.min_shadow,
             "max_window_s": args.max_window_s}  # fmt: skip
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp_name:
        tmp = Path(tmp_name)
        # the bridges' request journals start empty: one left by an earlier run remembers its
        # request ids with other texts and answers their reuse `id_reused`, as it should
        os.environ["EDGEINFER_STATE_DIR"] = str(tmp / "state")
        broker = Mosquitto(tmp / "broker").start()
        url = broker.url
        key, pub, _ = generate_keypair(tmp / "keys" / "release")
        packages = releases(tmp / "pkgs", key, trial=trial, versions=(3, 2))
        statuses = Statuses(url)
        devices = {}
        for n in range(FLEET):
            device = Device(f"gw-{n:02d}", tmp / f"gw-{n:02d}", url, pub, packages.origin)
            devices[device.device_id] = device.start()
            device.connect()
        devices[OFFLINE].stop()
        traffic = Traffic(list(devices.values())).start()
        try:
            bad = _bad_run(url, packages.bad, tmp / "state", statuses)
            good = _good_run(url, packages.good, tmp / "state", devices, statuses)
        finally:
            traffic.stop()
            result = {
                "uptime": os.getloadavg(), "cpus": os.cpu_count(), "trial": trial,
                "bad_release": locals().get("bad"), "good_release": locals().get("good"),
                "requests": summary(list(devices.values())),
            }  # fmt: skip
            for device in devices.values():
                device.stop()
                if device.client is not None:
                    device.client.close()
            broker.stop()
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
