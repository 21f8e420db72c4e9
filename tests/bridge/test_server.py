"""Serving as a library: ``edgeinfer.bridge.Server`` started from Python on a real mosquitto
answers several clients and stops cleanly; ``edgeinfer serve`` maps every flag to the
settings that server runs with (read back from its ``--json`` ready line)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bridge_harness import Mosquitto
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

import edgeinfer
from edgeinfer.bridge import (
    BridgeConfig,
    Client,
    Connection,
    DeploySettings,
    Server,
    ServeSettings,
    serve,
)
from edgeinfer.cli import main
from edgeinfer.errors import ConfigError

READY_S = 120  # loading and a first connect on a loaded machine, not a timing assertion


def _settings(broker: Mosquitto, tmp_path: Path, device: str) -> ServeSettings:
    bridge = BridgeConfig(
        connection=Connection(broker=broker.url, client_id=f"{device}-bridge"),
        device_id=device,
        metrics_interval_s=0,
        journal_dir=tmp_path / "journal",
    )
    return ServeSettings(bridge=bridge, threads=1)


def _retained_state(broker: Mosquitto, device: str) -> str:
    """The ``state`` of the bridge's retained status, as a fresh subscriber gets it."""
    got: list[bytes] = []
    arrived = threading.Event()
    reader = PahoClient(
        CallbackAPIVersion.VERSION2,
        client_id=f"{device}-reader",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    reader.on_connect = lambda c, *a: c.subscribe(f"edgeinfer/{device}/status", 1)
    reader.on_message = lambda c, u, message: (got.append(message.payload), arrived.set())
    reader.connect("127.0.0.1", broker.port)
    reader.loop_start()
    try:
        assert arrived.wait(30), "no retained status"
    finally:
        reader.disconnect()
        reader.loop_stop()
    return str(json.loads(got[0])["state"])


@pytest.fixture
def clients(broker: Mosquitto) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        client.close()


def test_a_server_started_from_python_answers_two_clients_and_stops(
    broker: Mosquitto, fast_encoder: Path, tmp_path: Path, clients: list[Client]
) -> None:
    server = Server([fast_encoder], settings=_settings(broker, tmp_path, "lib"))
    ready = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(server.run(on_ready=lambda _: ready.set()))
    )
    thread.start()
    try:
        assert ready.wait(READY_S), "the server did not start"
        expected = edgeinfer.load(fast_encoder).embed(["valve 3", "pump 9"])
        for n, text in enumerate(["valve 3", "pump 9"]):
            connection = Connection(broker=broker.url, client_id=f"lib-client-{n}")
            clients.append(Client(connection=connection, device_id="lib").connect())
            reply = clients[-1].request(fast_encoder.name, text=text)
            assert reply["ok"] is True and reply["model"] == fast_encoder.name
            np.testing.assert_allclose(reply["result"][0], expected[n], rtol=1e-4, atol=1e-5)
    finally:
        server.stop()
        thread.join(READY_S)
    assert not thread.is_alive() and codes == [0]
    assert _retained_state(broker, "lib") == "offline"


def test_a_server_started_without_run_stops_its_bridge(
    broker: Mosquitto, fast_encoder: Path, tmp_path: Path, clients: list[Client]
) -> None:
    server = Server([fast_encoder], settings=_settings(broker, tmp_path, "lib-start"))
    server.start()
    try:
        connection = Connection(broker=broker.url, client_id="lib-start-client")
        clients.append(Client(connection=connection, device_id="lib-start").connect())
        assert clients[0].request(fast_encoder.name, text="one")["ok"] is True
        assert _retained_state(broker, "lib-start") == "online"
    finally:
        server.stop()
    assert _retained_state(broker, "lib-start") == "offline"


def test_two_packages_with_one_folder_name_are_refused(fast_encoder: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / fast_encoder.name
    settings = ServeSettings(
        bridge=BridgeConfig(connection=Connection(client_id="x"), device_id="x")
    )
    with pytest.raises(ConfigError, match="share a folder name"):
        serve([fast_encoder, other], settings=settings)
    with pytest.raises(ConfigError, match="trusted key"):
        DeploySettings(folder=tmp_path, trusted_keys=())


def _serve_until_ready(command: list[str]) -> tuple[dict[str, Any], str, str]:
    """Run ``edgeinfer serve ... --json`` until its ready line, then SIGTERM it: the ready
    line, the rest of stdout and stderr (it must exit 0)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "null")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=READY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ready is not None and proc.returncode == 0, err
    return ready, out, err


def test_every_serve_flag_reaches_the_settings_the_server_runs_with(
    broker: Mosquitto, fast_encoder: Path, tmp_path: Path
) -> None:
    assert main(["keygen", "-o", str(tmp_path / "release")]) == 0
    command = [
        sys.executable, "-m", "edgeinfer", "serve", str(fast_encoder), "--json",
        "--broker", broker.url, "--device-id", "flags", "--metrics-interval-s", "0",
        "--threads", "1", "--max-payload", "64KiB", "--reply-cache", "8MiB",
        "--kv-budget", "16MiB", "--memory-budget", "1GiB", "--max-generations", "3",
        "--max-client-requests", "5", "--max-client-generations", "2",
        "--journal-dir", str(tmp_path / "journal"), "--journal-keep-s", "90",
        "--deploy-dir", str(tmp_path / "deploys"), "--trusted-key", str(tmp_path / "release.pub"),
        "--compatible", "plc-fleet", "--check-timeout-s", "45", "--check-memory", "512MiB",
    ]  # fmt: skip
    ready, out, err = _serve_until_ready(command)
    assert json.loads(out) == {"state": "stopped"} and "stopped" in err
    bridge, runtime, deploy = ready["bridge"], ready["runtime"], ready["deploy"]
    assert ready["state"] == "serving" and ready["models"] == [fast_encoder.name]
    assert (bridge["max_payload_bytes"], bridge["reply_cache_bytes"]) == (64 << 10, 8 << 20)
    assert (bridge["max_client_requests"], bridge["max_client_generations"]) == (5, 2)
    assert (bridge["journal_dir"], bridge["journal_keep_s"]) == (str(tmp_path / "journal"), 90)
    assert bridge["max_generations"] == 3 and "password" not in bridge["connection"]
    assert runtime == {
        "threads": 1,
        "cache": False,
        "file_backed_prepacks": False,
        "memory_budget_bytes": 1 << 30,
        "kv_budget_bytes": 16 << 20,
    }
    assert deploy["check_timeout_s"] == 45 and deploy["check_memory_bytes"] == 512 << 20
    assert deploy["compatible"] == ["plc-fleet"]
    # The deploy check loads a package as the server will serve it.
    assert deploy["check_load"] == {
        "threads": 1,
        "generations": 3,
        "kv_budget_bytes": 16 << 20,
        "file_backed_prepacks": False,
        "memory_budget_bytes": 1 << 30,
    }


def test_an_old_size_flag_still_reaches_its_setting(
    broker: Mosquitto, fast_encoder: Path, tmp_path: Path
) -> None:
    command = [
        sys.executable, "-m", "edgeinfer", "serve", str(fast_encoder), "--json",
        "--broker", broker.url, "--device-id", "old-flags", "--metrics-interval-s", "0",
        "--journal-dir", str(tmp_path / "journal"),
        "--max-payload-bytes", "70000", "--reply-cache-mb", "3",
    ]  # fmt: skip
    ready, _, err = _serve_until_ready(command)
    assert ready["bridge"]["max_payload_bytes"] == 70000
    assert ready["bridge"]["reply_cache_bytes"] == 3 << 20
    assert "--max-payload-bytes is deprecated; use --max-payload" in err
    assert "--reply-cache-mb is deprecated; use --reply-cache" in err
