"""``edgeinfer serve`` as a real process: serves a package, reports metrics, stops on SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

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
    broker: Mosquitto, minilm_int8: Path, tmp_path: Path
) -> None:
    """``serve --deploy-dir`` wiring: a deploy signed by an untrusted key is refused (exit 1),
    and --deploy-dir without a --trusted-key is a usage error (exit 2)."""
    from edgeinfer.cli import main

    assert main(["keygen", "-o", str(tmp_path / "trusted")]) == 0
    assert main(["keygen", "-o", str(tmp_path / "other")]) == 0
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    signing = ["sign", str(package), "--key", str(tmp_path / "other.key"), "--device", "cli-deploy"]
    assert main(signing) == 0
    base = [
        sys.executable,
        "-m",
        "edgeinfer",
        "serve",
        str(minilm_int8),
        "--broker",
        broker.url,
        "--device-id",
        "cli-deploy",
        "--deploy-dir",
        str(tmp_path / "deployed"),
    ]
    no_key = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert no_key.returncode == 2 and "--trusted-key" in no_key.stderr
    proc = subprocess.Popen(
        [*base, "--trusted-key", str(tmp_path / "trusted.pub")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        code = main(
            [
                "deploy",
                str(package),
                "--broker",
                broker.url,
                "--device-id",
                "cli-deploy",
                "--timeout-s",
                "120",
            ]
        )
        assert code == 1  # refused: the signer is not trusted (the bridge answered)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
