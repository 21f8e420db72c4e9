"""docs/mqtt.md's mosquitto configurations, started as written: the plain one, and the one with
TLS, a password file (made by the docs' ``mosquitto_passwd`` commands) and the docs' ACL.

Only what must differ on a test machine changes: the port (a free one, on loopback), the folders
(``/etc/mosquitto/`` and ``/var/lib/mosquitto/`` -> the test's), and a ``user`` line naming the
user running the test (as root, mosquitto would switch to ``mosquitto``, who cannot enter the
test's private folder). Each broker then serves a real ``edgeinfer serve``.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from interop_harness import HANG_S, LOOPBACK, PUB, SUB, blocks, rr, start_serve
from mosquitto import MOSQUITTO_PASSWD, OPENSSL, Mosquitto, Secure, require_mosquitto
from paho.mqtt.client import Client as PahoClient
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

PASSWORDS = {
    "BRIDGE_PASSWORD": "bridge-" + os.urandom(4).hex(),
    "SENSOR_PASSWORD": "s7-secret",
    "HA_PASSWORD": "ha-" + os.urandom(4).hex(),
    "NODERED_PASSWORD": "nr-" + os.urandom(4).hex(),
}


def docs_broker(
    workdir: Path, conf: str, *, docs_port: str, secure: Secure | None = None
) -> Mosquitto:
    """A mosquitto started from one of the docs' configurations (see the module docstring)."""
    require_mosquitto()
    server = Mosquitto(workdir, secure=secure)
    text = conf.replace("/etc/mosquitto/", f"{workdir}/etc/").replace(
        "/var/lib/mosquitto/", f"{workdir}/var/"
    )
    text = text.replace(f"listener {docs_port} 127.0.0.1", f"listener {docs_port}")
    text = text.replace(f"listener {docs_port}", f"listener {server.port} {LOOPBACK}")
    (workdir / "var").mkdir(exist_ok=True)
    user = pwd.getpwuid(os.getuid()).pw_name
    server.config.write_text(f"{text}\nuser {user}\nlog_dest file {workdir / 'mosquitto.log'}\n")
    return server.start()


def test_the_plain_configuration_serves_as_written(tmp_path: Path, minilm_int8: Path) -> None:
    _, conf = blocks()["mosquitto-plain"]
    server = docs_broker(tmp_path, conf, docs_port="1883")
    try:
        served = start_serve(server, [minilm_int8], tmp_path / "serve.log")
        try:
            (reply,) = rr(
                server.port,
                *("-t", "edgeinfer/plc7/minilm-int8/req", "-e", "edgeinfer/plc7/reply/conf-1"),
                *("-m", json.dumps({"id": "conf-1", "text": "pressure rising fast"})),
            )
            assert reply["ok"] and len(reply["result"][0]) == 384
        finally:
            assert served.stop() == 0
    finally:
        server.stop()
    assert (tmp_path / "var" / "mosquitto.db").exists()  # the persistence folder is written


@pytest.fixture
def secured(tmp_path: Path) -> Mosquitto:
    """The docs' TLS + password file + ACL broker, its files made by the docs' commands."""
    if MOSQUITTO_PASSWD is None:
        pytest.skip("mosquitto_passwd is needed to make the password file")
    if OPENSSL is None:
        pytest.skip("the openssl command is needed to make the certificates")
    etc = tmp_path / "etc"
    _, acl = blocks()["acl"]
    etc.mkdir()
    (etc / "acl").write_text(acl + "\n")
    for name in ("tls-certs", "mosquitto-passwd"):  # the docs' commands, in the test's folder
        local = blocks()[name][1].replace("/etc/mosquitto/", f"{etc}/")
        names = {"BROKER_HOST": "localhost", "BROKER_IP": LOOPBACK}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", local],
            env={**os.environ, **PASSWORDS, **names},
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert done.returncode == 0, done.stderr
    ca, cert, key = (etc / "certs" / n for n in ("ca.crt", "server.crt", "server.key"))
    _, conf = blocks()["mosquitto-tls"]
    secure = Secure("sensor-7", PASSWORDS["SENSOR_PASSWORD"], ca, cert, key)
    return docs_broker(tmp_path, conf, docs_port="8883", secure=secure)


def _as(user: str, password: str, ca: Path, client_id: str) -> list[str]:
    return ["--cafile", str(ca), "-u", user, "-P", password, "-i", client_id]


def _client(tool: str | None, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """mosquitto_sub or mosquitto_pub on the test broker, as run (not checked)."""
    assert tool is not None
    return subprocess.run(
        [tool, "-h", LOOPBACK, "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=HANG_S + 10,
    )


def test_tls_passwords_and_the_acl_as_written(
    secured: Mosquitto, tmp_path: Path, minilm_int8: Path
) -> None:
    assert secured.secure is not None
    ca, port = secured.secure.ca, secured.port
    sensor = _as("sensor-7", PASSWORDS["SENSOR_PASSWORD"], ca, "sensor-7")
    try:
        served = start_serve(
            secured,
            [minilm_int8],
            tmp_path / "serve.log",
            *("--tls-ca", str(ca), "--username", "bridge"),
            env={"EDGEINFER_MQTT_PASSWORD": PASSWORDS["BRIDGE_PASSWORD"]},
            client_args=sensor,
        )
        try:
            # A device reads its own reply topic (%c = its client id) and gets its answer.
            (reply,) = rr(
                port,
                *sensor,
                *("-t", "edgeinfer/plc7/minilm-int8/req", "-e", "edgeinfer/clients/sensor-7/reply"),
                *("-m", json.dumps({"id": "acl-1", "text": "pressure rising fast"})),
            )
            assert reply["ok"] and reply["id"] == "acl-1"
            # It may not read another client's replies. Its persistent session subscribes to
            # both topics; a request answered on the other's topic, then one on its own: the
            # first reply it reads is its own (mosquitto never delivers what it may not read).
            other, own = "edgeinfer/clients/x/reply", "edgeinfer/clients/sensor-7/reply"
            session = (*sensor, "-c", "-q", "1", "-t", other, "-t", own)
            assert _client(SUB, port, *session, "-E").returncode == 0
            sender = _as("sensor-7", PASSWORDS["SENSOR_PASSWORD"], ca, "sensor-7-pub")
            for n, topic in enumerate((other, own)):
                body = json.dumps({"id": f"acl-{n + 2}", "text": "pressure rising fast"})
                request = ("-q", "1", "-t", "edgeinfer/plc7/minilm-int8/req", "-m", body)
                response = ("-D", "publish", "response-topic", topic)
                assert _client(PUB, port, *sender, *request, *response).returncode == 0
            first = _client(SUB, port, *session, "-v", "-C", "1")
            topic, payload = first.stdout.split(" ", 1)
            assert topic == own and json.loads(payload)["id"] == "acl-3"
            # Nor write the bridge's status: the broker drops it, the retained status stays.
            fake = ("-q", "1", "-r", "-t", "edgeinfer/plc7/status", "-m", '{"state": "offline"}')
            assert _client(PUB, port, *sensor, *fake).returncode == 0
            status = _client(SUB, port, *sensor, "-t", "edgeinfer/plc7/status", "-C", "1")
            assert json.loads(status.stdout)["state"] == "online"
            # Without a password nobody gets in (allow_anonymous false).
            assert _client(SUB, port, "--cafile", str(ca), "-t", "#", "-E").returncode != 0
        finally:
            assert served.stop() == 0
    finally:
        secured.stop()


class Login:
    """A paho v5 client over the docs' TLS, logged in as ``user``: every message it reads."""

    def __init__(self, broker: Mosquitto, user: str, password: str, client_id: str) -> None:
        assert broker.secure is not None
        self.messages: list[tuple[str, bytes]] = []
        self.acks: list[int] = []
        self._cond = threading.Condition()
        self.client = PahoClient(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
        )
        self.client.username_pw_set(user, password)
        self.client.tls_set(ca_certs=str(broker.secure.ca))
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.client.connect(LOOPBACK, broker.port)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._cond:
            self.messages.append((message.topic, bytes(message.payload)))
            self._cond.notify_all()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        with self._cond:
            self.acks.append(int(reason.value))
            self._cond.notify_all()

    def subscribe(self, *topics: str) -> None:
        self.client.subscribe([(t, 1) for t in topics])

    def wait(self, what: Callable[[], bool]) -> None:
        with self._cond:
            assert self._cond.wait_for(what, timeout=HANG_S), self.messages[-5:]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _options(folder: Path, ca: Path, user: str, password: str) -> dict[str, str]:
    """mosquitto_rr/pub/sub read default options from $XDG_CONFIG_HOME/<tool>: the login and
    the CA, so that the docs' commands run as written, as ``user``."""
    folder.mkdir()
    for tool in ("mosquitto_rr", "mosquitto_pub", "mosquitto_sub"):
        (folder / tool).write_text(f"--cafile {ca}\n-u {user}\n-P {password}\n")
    return {"XDG_CONFIG_HOME": str(folder)}


def test_every_party_of_the_docs_acl_gets_what_it_needs(
    secured: Mosquitto, tmp_path: Path, minilm_int8: Path
) -> None:
    """Under the docs' ACL (and TLS, and passwords, all made by the docs' commands): the bridge
    publishes everything (its replies, status, metrics, discovery) without one refusal; the docs'
    shell commands run as written as sensor-7; Home Assistant's login reads discovery and metrics
    and writes its status; Node-RED's login asks and gets its answer."""
    assert secured.secure is not None
    ca, port = secured.secure.ca, secured.port
    sensor = _as("sensor-7", PASSWORDS["SENSOR_PASSWORD"], ca, "sensor-7")
    env = _options(tmp_path / "config", ca, "sensor-7", PASSWORDS["SENSOR_PASSWORD"])
    log = tmp_path / "serve.log"
    served = start_serve(
        secured,
        [minilm_int8],
        log,
        *("--tls-ca", str(ca), "--username", "bridge", "--ha-discovery", "homeassistant"),
        *("--metrics-interval-s", "1"),
        env={"EDGEINFER_MQTT_PASSWORD": PASSWORDS["BRIDGE_PASSWORD"]},
        client_args=sensor,
    )
    ha = Login(secured, "homeassistant", PASSWORDS["HA_PASSWORD"], "homeassistant")
    nodered = Login(secured, "nodered", PASSWORDS["NODERED_PASSWORD"], "nodered")
    try:
        for name, rid in (("shell-embed", "sh-1"), ("shell-embed-311", "sh-2")):
            command = blocks()[name][1].replace("1883", str(port))
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=HANG_S,
            )
            assert done.returncode == 0, done.stderr
            reply = json.loads(done.stdout)
            assert reply["ok"] and reply["id"] == rid
        ha.subscribe("homeassistant/#", "edgeinfer/plc7/metrics/#")
        ha.wait(lambda: any(t.startswith("homeassistant/") for t, _ in ha.messages))
        ha.wait(lambda: any("/metrics" in t for t, _ in ha.messages))
        ha.client.publish("homeassistant/status", b"online", qos=1)  # its birth message
        ha.wait(lambda: bool(ha.acks))
        assert ha.acks == [0]  # accepted (0x87 would be Not authorized)
        reply_topic = "edgeinfer/clients/nodered/reply"
        nodered.subscribe(reply_topic)
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = reply_topic
        props.CorrelationData = b"nr-1"
        body = json.dumps({"id": "nr-1", "text": "pressure rising fast"}).encode()
        nodered.client.publish("edgeinfer/plc7/minilm-int8/req", body, qos=1, properties=props)
        nodered.wait(lambda: any(t == reply_topic for t, _ in nodered.messages))
        (answer,) = [json.loads(p) for t, p in nodered.messages if t == reply_topic]
        assert answer["ok"] and answer["id"] == "nr-1"
    finally:
        ha.close()
        nodered.close()
        assert served.stop() == 0
        secured.stop()
    assert "refused a publish" not in log.read_text()  # nothing the bridge sends is refused
