"""Trial then commit on the device, with real tiny packages over a REAL mosquitto: a release
that answers as the one it replaces commits; one that passes its smoke check but embeds some
live texts elsewhere is caught by the shadow comparison and rolled back by the device itself;
a bridge stopped mid-trial serves the previous package when it starts again."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from bridge_harness import Mosquitto
from fleet_harness import NAME, PERTURBED, TRIAL, Device, live_text, releases, state_file

from edgeinfer.bridge import Connection, deploy_package
from edgeinfer.bridge.fleet.inventory import FleetWatch, fleet_status
from edgeinfer.bridge.ota.signing import generate_keypair
from edgeinfer.manifest import Manifest


def _device(broker: Mosquitto, tmp: Path, pub: Path, origin: Path, n: int) -> Device:
    device = Device(f"trial-{n}-{os.urandom(2).hex()}", tmp / f"dev{n}", broker.url, pub, origin)
    device.start().connect()
    return device


def _deploy(broker: Mosquitto, device: Device, package: Path) -> dict[str, object]:
    connection = Connection(broker=broker.url, client_id=f"op-{os.urandom(4).hex()}")
    return deploy_package(package, connection=connection, device_id=device.device_id,
                          timeout_s=120).status  # fmt: skip


def _verdict(watch: FleetWatch, device: Device) -> dict[str, object]:
    def done() -> dict[str, object] | None:
        view = watch.device(device.device_id)
        state = view.deploy.get("state") if view else None
        return view.deploy if view and state in ("committed", "rolled_back", "failed") else None

    rng = random.Random(1)
    for _ in range(200):  # live traffic until the device judged (a hang guard of 200 rounds)
        device.ask(rng, 5)
        found = watch.wait_for(done, timeout_s=0.01)
        if found is not None:
            return found
    raise AssertionError(f"no verdict from {device.device_id}")


def test_trial_commits_a_good_release_and_rolls_back_one_live_traffic_catches(
    broker: Mosquitto, tmp_path: Path
) -> None:
    key, pub, _ = generate_keypair(tmp_path / "keys" / "release")
    packages = releases(tmp_path / "pkgs", key)
    good_device = _device(broker, tmp_path, pub, packages.origin, 0)
    bad_device = _device(broker, tmp_path, pub, packages.origin, 1)
    watch = FleetWatch(Connection(broker=broker.url, client_id="watch-trial"))
    try:
        good = Manifest.read(packages.good).digest
        origin = Manifest.read(packages.origin).digest
        assert _deploy(broker, good_device, packages.good)["state"] == "trial"
        assert _deploy(broker, bad_device, packages.bad)["state"] == "trial"
        assert state_file(bad_device)["trial"] is not None  # a restart would roll it back

        committed = _verdict(watch, good_device)
        assert committed["state"] == "committed", committed
        assert good_device.serves() == good and state_file(good_device)["trial"] is None

        rolled = _verdict(watch, bad_device)
        assert rolled["state"] == "rolled_back" and rolled["reason"] == "trial_agreement"
        trial = rolled["trial"]
        assert isinstance(trial, dict) and trial["agreement"] < TRIAL.get("min_agreement", 0.95)
        assert trial["shadowed"] >= TRIAL["min_shadow"]
        assert bad_device.serves() == origin and rolled["digest"] == origin
        assert rolled["trial_digest"] == Manifest.read(packages.bad).digest
        assert state_file(bad_device)["trial"] is None

        look = Connection(broker=broker.url, client_id="fleet-look")
        views = {v.device_id: v for v in fleet_status(connection=look, wait_s=5)}
        assert views[good_device.device_id].models[NAME]["digest"] == good
        assert views[bad_device.device_id].health == "rolled_back"
        assert views[bad_device.device_id].compatible == ("plant-gw",)
    finally:
        watch.close()
        for d in (good_device, bad_device):
            d.stop()


def test_a_bridge_stopped_mid_trial_serves_the_previous_package_again(
    broker: Mosquitto, tmp_path: Path
) -> None:
    key, pub, _ = generate_keypair(tmp_path / "keys" / "release")
    # A window no traffic here fills: the trial is still under way when the bridge stops.
    packages = releases(tmp_path / "pkgs", key, trial={**TRIAL, "min_requests": 10_000})
    device = _device(broker, tmp_path, pub, packages.origin, 2)
    try:
        assert _deploy(broker, device, packages.good)["state"] == "trial"
        device.ask(random.Random(2), 5)
        assert device.serves() == Manifest.read(packages.good).digest
        device.stop()
        device.start()
        assert device.serves() == Manifest.read(packages.origin).digest
        assert state_file(device)["trial"] is None
        assert state_file(device)["previous"]["digest"] == Manifest.read(packages.good).digest
    finally:
        device.stop()


def test_perturbed_words_are_in_live_traffic_and_not_in_the_smoke_cases() -> None:
    """The bad release's premise: its smoke texts avoid the words it changed; live ones hit
    them often enough for the shadow to see it."""
    from fleet_harness import SMOKE_TEXTS

    assert not any(w in t.split() for t in SMOKE_TEXTS for w in PERTURBED)
    rng = random.Random(0)
    hits = sum(any(w in live_text(rng).split() for w in PERTURBED) for _ in range(1000))
    assert 450 < hits < 750


def test_fleet_status_over_tls_with_credentials_lists_each_device(
    secure_broker: Mosquitto, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``edgeinfer fleet status --json`` over TLS with a password file: two devices, what
    they serve and their class; a wrong password exits 2 (broker_auth)."""
    from fleet_harness import CLASS, load

    from edgeinfer.bridge import Bridge, BridgeConfig, DeployConfig, TrustedKeys
    from edgeinfer.cli import main

    secure = secure_broker.secure
    assert secure is not None
    _, pub, _ = generate_keypair(tmp_path / "keys" / "release")
    origin = releases(tmp_path / "pkgs", tmp_path / "keys" / "release.key").origin
    bridges = []
    for n in range(2):
        connection = Connection(broker=secure_broker.url, client_id=f"b-tls-{n}",
                                username=secure.username, password=secure.password,
                                tls_ca=secure.ca)  # fmt: skip
        bridge = Bridge(
            {NAME: load(origin)},
            config=BridgeConfig(connection=connection, device_id=f"tls-{n}", metrics_interval_s=0),
            deploy=DeployConfig(
                folder=tmp_path / f"d{n}", trusted=TrustedKeys.load([pub]), compatible=(CLASS,)
            ),
            origins={NAME: origin},
        )
        bridges.append(bridge.start())
    password = tmp_path / "pass"
    password.write_text(secure.password + "\n")
    options = ["--broker", secure_broker.url, "--tls-ca", str(secure.ca), "--username",
               secure.username, "--wait-s", "3"]  # fmt: skip
    try:
        capsys.readouterr()
        assert main(["fleet", "status", *options, "--password-file", str(password), "--json"]) == 0
        listed = {d["device_id"]: d for d in json.loads(capsys.readouterr().out)}
        digest = Manifest.read(origin).digest
        for n in range(2):
            device = listed[f"tls-{n}"]
            assert device["health"] == "ok" and device["compatible"] == [CLASS]
            assert device["models"][NAME]["digest"] == digest
        password.write_text("wrong\n")
        assert main(["fleet", "status", *options, "--password-file", str(password)]) == 2
        assert "broker_auth" in capsys.readouterr().err
    finally:
        for bridge in bridges:
            bridge.stop()
