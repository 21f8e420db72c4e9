"""``edgeinfer serve`` as a real process: serves a package, reports metrics, stops on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto

from edgeinfer.bridge import Client, Connection


def test_serve_command_round_trip_and_clean_stop(
    broker: Mosquitto, minilm_int8: Path, harness: Harness, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "EDGEINFER_MQTT_USERNAME": "cli-user",
        "EDGEINFER_MQTT_PASSWORD": "cli-password-never-logged",
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgeinfer",
                "serve",
                str(minilm_int8),
                "--broker",
                broker.url,
                "--device-id",
                "cli",
                "--client-id",
                "cli-bridge",
                "--max-queue",
                "8",
                "--metrics-interval-s",
                "0.5",
                "--threads",
                "1",
                "--cache",
                "--cache-dir",
                str(tmp_path / "cache"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            client = Client(
                connection=Connection(broker=broker.url, client_id="cli-client"), device_id="cli"
            )
            harness.clients.append(client)
            client.connect()
            # The first attempts may come before the bridge subscribed: its persistent session
            # does not exist yet, so re-sends (same id) cover the start-up.
            reply = client.request(
                minilm_int8.name,
                text="from the command line",
                attempt_timeout_s=1.0,
                retries=120,
                backoff=1.0,
            )
            assert reply["ok"] and reply["model"] == minilm_int8.name
            assert len(reply["result"][0]) == 384
            again = client.request(minilm_int8.name, text="from the command line")  # new id
            assert again["cached"] is True and again["result"] == reply["result"]
            assert list((tmp_path / "cache").iterdir())  # the persistent store was written
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert "serving" in text and "stopped" in text
    assert "cli-password-never-logged" not in text


def test_serve_rejects_a_bad_broker_url(minilm_int8: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeinfer",
            "serve",
            str(minilm_int8),
            "--broker",
            "http://127.0.0.1:1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "mqtt://HOST:PORT" in result.stderr


def test_serve_with_a_wrong_password_exits_2_without_echoing_it(
    secure_broker: Mosquitto, minilm_int8: Path
) -> None:
    assert secure_broker.secure is not None
    env = {**os.environ, "EDGEINFER_MQTT_PASSWORD": "wrong-password-never-logged"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeinfer",
            "serve",
            str(minilm_int8),
            "--broker",
            secure_broker.url,
            "--tls-ca",
            str(secure_broker.secure.ca),
            "--username",
            secure_broker.secure.username,
            "--device-id",
            "cli-denied",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2 and "refused" in result.stderr
    assert "(broker_auth)" in result.stderr
    assert "wrong-password-never-logged" not in result.stdout + result.stderr


def test_serve_takes_deploys_only_from_trusted_keys(
    broker: Mosquitto, minilm_int8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``serve --deploy-dir`` wiring: a deploy signed by an untrusted key or by a revoked one
    (``--revoked``) is refused (exit 1), one signed for the device's ``--compatible`` class
    by a trusted key is served (exit 0), and --deploy-dir without a --trusted-key is a usage
    error (exit 2)."""
    from edgeinfer.cli import main

    keys = tmp_path / "keys"
    assert main(["keygen", "-o", str(keys / "trusted")]) == 0
    assert main(["keygen", "-o", str(keys / "other")]) == 0
    rotated = ["keygen", "-o", str(keys / "lost"), "--rotate-from", str(keys / "trusted.key")]
    assert main([*rotated, "--json"]) == 0
    lost_id = json.loads(capsys.readouterr().out)["key_id"]
    (tmp_path / "revoked.txt").write_text(f"# the laptop stolen in March\n{lost_id}\n")

    def signed(key: str, version: int) -> Path:
        package = tmp_path / f"pkg-{key}"
        shutil.copytree(minilm_int8, package)
        signing = ["sign", str(package), "--key", str(keys / f"{key}.key")]
        assert main([*signing, "--compatible", "plc-fleet", "--version", str(version)]) == 0
        return package

    base = [sys.executable, "-m", "edgeinfer", "serve", str(minilm_int8), "--broker", broker.url]
    base += ["--device-id", "cli-deploy", "--deploy-dir", str(tmp_path / "deployed")]
    no_key = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert no_key.returncode == 2 and "--trusted-key" in no_key.stderr
    base += ["--trusted-key", str(keys / "trusted.pub"), "--revoked", str(tmp_path / "revoked.txt")]
    proc = subprocess.Popen(
        [*base, "--compatible", "plc-fleet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deploy = ["--broker", broker.url, "--device-id", "cli-deploy", "--timeout-s", "120", "--json"]
    try:
        for key, version, code, reason in (
            ("other", 2, 1, "untrusted"),
            ("lost", 3, 1, "revoked"),
            ("trusted", 4, 0, None),
        ):
            capsys.readouterr()
            assert main(["deploy", str(signed(key, version)), *deploy]) == code
            assert json.loads(capsys.readouterr().out).get("reason") == reason
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
