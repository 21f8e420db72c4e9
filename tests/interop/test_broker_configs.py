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
from pathlib import Path

import pytest
from interop_harness import HANG_S, LOOPBACK, PUB, SUB, blocks, rr, start_serve
from mosquitto import MOSQUITTO_PASSWD, Mosquitto, Secure, make_certificates, require_mosquitto

PASSWORDS = {"BRIDGE_PASSWORD": "bridge-" + os.urandom(4).hex(), "SENSOR_PASSWORD": "s7-secret"}


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
    etc = tmp_path / "etc"
    ca, cert, key = make_certificates(etc / "certs")  # ca.crt, server.crt, server.key as docs
    _, acl = blocks()["acl"]
    (etc / "acl").write_text(acl + "\n")
    _, passwd = blocks()["mosquitto-passwd"]
    local = passwd.replace("/etc/mosquitto/", f"{etc}/")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", local],
        env={**os.environ, **PASSWORDS},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
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
