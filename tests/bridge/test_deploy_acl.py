"""The mosquitto ACL of docs/mqtt.md, exactly as written there, on a real mosquitto with a
login per party: a sensor's requests are answered while its publish to the deploy topic is
refused by the broker (never reaching the bridge), and the release workstation deploys."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import LOOPBACK, Harness, Mosquitto, require_mosquitto
from deploy_harness import deploy_bridge, keypair, release
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgeinfer.bridge import Client, Connection, deploy_package
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.manifest import Manifest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mqtt.md"
USERS = ("plc7-bridge", "plc7-sensor", "fleet-operator")
NOT_AUTHORIZED = 135  # MQTT v5 reason code


def _documented_acl() -> str:
    text = DOCS.read_text()
    start = text.index("```\n# acl_file: edgeinfer with deploys") + len("```\n")
    return text[start : text.index("```", start)]


def _password(user: str) -> str:
    return f"pw-{user}"


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    require_mosquitto()
    server = Mosquitto(tmp_path / "mosquitto")
    server.require_logins({user: _password(user) for user in USERS}, _documented_acl())
    server.start()
    yield server
    server.stop()


def _login(broker: Mosquitto, user: str, client_id: str) -> Connection:
    return Connection(
        broker=broker.url, client_id=client_id, username=user, password=_password(user)
    )


def _publish_as(broker: Mosquitto, user: str, topic: str, payload: bytes) -> int:
    """Publish at QoS 1 as ``user``; the broker's PUBACK reason code."""
    acked: list[int] = []
    done = threading.Event()
    client = PahoClient(
        CallbackAPIVersion.VERSION2, client_id=f"{user}-raw", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.username_pw_set(user, _password(user))

    def on_publish(client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        acked.append(int(reason.value))
        done.set()

    client.on_publish = on_publish
    client.connect(LOOPBACK, broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1)
        assert done.wait(30), "no PUBACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return acked[0]


@pytest.mark.slow
def test_the_documented_acl_keeps_sensors_off_the_deploy_topics(
    acl_broker: Mosquitto, harness: Harness, minilm_int8: Path, tmp_path: Path
) -> None:
    key, pub = keypair(tmp_path / "keys", "release")
    v2 = release(minilm_int8, tmp_path, 2, key=key, sign_options=("--device-id", "plc7"))
    login = {"username": "plc7-bridge", "password": _password("plc7-bridge")}
    folder = tmp_path / "deployed"
    bridge = deploy_bridge(
        acl_broker, harness, folder, trusted=[pub], origin=minilm_int8, device="plc7", login=login
    )
    sensor = Client(connection=_login(acl_broker, "plc7-sensor", "sensor-1"), device_id="plc7")
    try:
        sensor.connect()
        assert sensor.request("minilm", text="pressure rising")["ok"]
        begin = {"op": "begin", "name": "minilm", "nonce": "from-a-sensor", "chunk_bytes": 1024}
        begin["manifest"] = (v2 / "manifest.json").read_bytes()
        ota = "edgeinfer/plc7/ota/ctl"
        assert _publish_as(acl_broker, "plc7-sensor", ota, proto.packb(begin)) == NOT_AUTHORIZED
        assert bridge.deployer is not None and bridge.deployer.status.last == {}  # never came
        outcome = deploy_package(
            v2,
            connection=_login(acl_broker, "fleet-operator", f"op-{os.urandom(4).hex()}"),
            device_id="plc7",
            name="minilm",
            timeout_s=120,
        )
        assert outcome.status["state"] == "active"
        assert bridge.status()["models"]["minilm"]["digest"] == Manifest.read(v2).digest
        assert sensor.request("minilm", text="pressure rising")["ok"]
    finally:
        sensor.close()
