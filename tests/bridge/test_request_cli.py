"""``edgeinfer request`` as a real process against a real mosquitto and a real bridge.

Exit codes: 0 on an ``ok`` reply, 1 on an error reply, 2 on usage, connection, authentication
and no-reply problems; the reply is the JSON on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto, free_port

from edgeinfer.errors import BridgeError, RequestTimeoutError


def _request(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", "request", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_an_ok_reply_is_printed_and_exits_0(broker: Mosquitto, harness: Harness) -> None:
    _, counting = harness.bridge(broker, device_id="cli-req")
    result = _request(
        "--broker",
        broker.url,
        "--device-id",
        "cli-req",
        "minilm",
        '{"id": "cli-1", "text": "valve 3 pressure rising", "timeout_ms": 5000}',
        "--json",
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["ok"] is True and reply["id"] == "cli-1" and reply["model"] == "minilm"
    assert len(reply["result"]) == 1 and len(reply["result"][0]) == 384
    # Without --json the vector is one line: its length and first values, not 384 lines.
    summary = _request(
        "--broker", broker.url, "--device-id", "cli-req", "minilm", '{"text": "valve 3"}'
    )
    assert summary.returncode == 0, summary.stderr
    shown = json.loads(summary.stdout)
    assert shown["ok"] is True and shown["result"][0].startswith("384 numbers [")
    assert len(summary.stdout.splitlines()) < 40
    assert reply["slack_ms"] is not None
    assert counting.texts["valve 3 pressure rising"] == 1


def test_mqtt_311_round_trip(broker: Mosquitto, harness: Harness) -> None:
    harness.bridge(broker, device_id="cli-req-311", protocol="3.1.1")
    result = _request(
        "--broker",
        broker.url,
        "--device-id",
        "cli-req-311",
        "--protocol",
        "3.1.1",
        "minilm",
        '{"texts": ["one", "two"]}',
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["ok"] is True and len(reply["result"]) == 2


def test_error_replies_exit_1_and_the_model_is_not_run(broker: Mosquitto, harness: Harness) -> None:
    _, counting = harness.bridge(broker, device_id="cli-req-err")
    unknown = _request(
        "--broker", broker.url, "--device-id", "cli-req-err", "no-such-model", '{"text": "hello"}'
    )
    assert unknown.returncode == 1, unknown.stderr
    assert json.loads(unknown.stdout)["error"]["code"] == "unknown_model"
    late = _request(
        "--broker",
        broker.url,
        "--device-id",
        "cli-req-err",
        "minilm",
        '{"id": "too-late", "text": "already expired", "deadline_ms": 1}',
    )
    assert late.returncode == 1, late.stderr
    reply = json.loads(late.stdout)
    assert reply["id"] == "too-late" and reply["error"]["code"] == "deadline_exceeded"
    assert "deadline_exceeded" in late.stderr
    assert counting.calls == 0


@pytest.mark.parametrize("body", ["not json", "[1, 2]", '{"text": "x", "colour": "red"}'])
def test_a_bad_request_argument_exits_2_without_connecting(body: str) -> None:
    # Port 1 on loopback: nothing listens, so a connection attempt would fail differently.
    result = _request("--broker", "mqtt://127.0.0.1:1", "minilm", body)
    assert result.returncode == 2 and "(config)" in result.stderr
    assert result.stdout == ""


def test_no_broker_exits_2() -> None:
    result = _request(
        "--broker",
        f"mqtt://127.0.0.1:{free_port()}",
        "--connect-timeout-s",
        "1",
        "minilm",
        '{"text": "x"}',
    )
    assert result.returncode == 2 and "(broker_unavailable)" in result.stderr


@pytest.mark.parametrize("command", ["deploy", "rollback"])
def test_deploy_and_rollback_against_no_broker_exit_2_within_the_connect_timeout(
    command: str, tmp_path: Path
) -> None:
    """Not after their --timeout-s (600/300 s): the subprocess is killed long before that."""
    from fast_packages import tiny_raw

    from edgeinfer.cli import main

    assert main(["keygen", "-o", str(tmp_path / "k")]) == 0
    key = str(tmp_path / "k.key")
    if command == "deploy":  # a real signed package: the command gets as far as connecting
        package = tiny_raw(tmp_path / "pkg")
        assert main(["sign", str(package), "--key", key, "--device-id", "d"]) == 0
        target = ["deploy", str(package)]
    else:
        target = ["rollback", "minilm", "--key", key]
    broker = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeinfer",
            *target,
            "--device-id",
            "d",
            "--broker",
            broker,
            "--connect-timeout-s",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "(broker_unavailable)" in result.stderr, result.stderr


def test_no_reply_exits_2_after_the_retries(broker: Mosquitto, harness: Harness) -> None:
    # No bridge serves this device: every attempt goes unanswered.
    result = _request(
        "--broker",
        broker.url,
        "--device-id",
        "nobody-home",
        "--timeout-s",
        "0.2",
        "--retries",
        "1",
        "--backoff",
        "1",
        "minilm",
        '{"text": "hello?"}',
    )
    assert result.returncode == 2 and "(request_timeout)" in result.stderr
    assert "after 2 attempt(s)" in result.stderr
    # The library raises the same error, which is also a built-in TimeoutError.
    client = harness.client(broker, device_id="nobody-home")
    with pytest.raises(RequestTimeoutError) as caught:
        client.request("minilm", text="hello?", attempt_timeout_s=0.2, retries=0)
    assert isinstance(caught.value, TimeoutError) and isinstance(caught.value, BridgeError)


def test_tls_password_from_the_environment(secure_broker: Mosquitto, harness: Harness) -> None:
    assert secure_broker.secure is not None
    harness.bridge(secure_broker, device_id="cli-req-secure")
    args = [
        "--broker",
        secure_broker.url,
        "--tls-ca",
        str(secure_broker.secure.ca),
        "--device-id",
        "cli-req-secure",
        "minilm",
        '{"text": "encrypted"}',
    ]
    ok = _request(
        *args,
        env={
            "EDGEINFER_MQTT_USERNAME": secure_broker.secure.username,
            "EDGEINFER_MQTT_PASSWORD": secure_broker.secure.password,
        },
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    denied = _request(
        *args,
        env={
            "EDGEINFER_MQTT_USERNAME": secure_broker.secure.username,
            "EDGEINFER_MQTT_PASSWORD": "wrong-password-never-logged",
        },
    )
    assert denied.returncode == 2 and "(broker_auth)" in denied.stderr
    assert "wrong-password-never-logged" not in denied.stdout + denied.stderr


def test_a_generation_streams_through_the_command(broker: Mosquitto, fast_decoder: Path) -> None:
    import edgeinfer
    from edgeinfer.bridge import Bridge, BridgeConfig, Connection

    config = BridgeConfig(
        connection=Connection(broker=broker.url, client_id="b-cli-gen"),
        device_id="cli-gen",
        metrics_interval_s=0,
    )
    with Bridge({"tiny": edgeinfer.load(fast_decoder, threads=1)}, config=config):
        result = _request(
            "--broker",
            broker.url,
            "--device-id",
            "cli-gen",
            "tiny",
            '{"prompt": "the pump", "max_new_tokens": 12}',
        )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["done"] and reply["result"]["stop_reason"] in ("eos", "length")
    assert reply["result"]["text"].replace("\n", "") in result.stderr.replace("\n", "")
