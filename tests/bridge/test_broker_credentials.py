"""Broker credentials of the commands that connect (serve, request, deploy, rollback), as real
processes against a real mosquitto that takes only TLS with a user name and password.

A password is taken from ``EDGEINFER_MQTT_PASSWORD`` or ``--password-file`` without a word,
and from ``--password`` with a warning (a command line is readable by every local user); a
refused login exits 2 with ``broker_auth`` and says what to check, at once, not after the
command's own timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto

from edgeinfer.cli import main

DEVICE = "cli-credentials"
WARNING = "visible to every user"
# Far beyond the subprocess timeout below: a command that waited for its own timeout instead
# of failing on the broker's refusal would be killed, and the test would fail.
COMMAND_TIMEOUT_S = "3600"


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EDGEINFER_MQTT_")}
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


def _request(broker: Mosquitto, *extra: str) -> list[str]:
    assert broker.secure is not None
    return [
        "request",
        "--broker",
        broker.url,
        "--tls-ca",
        str(broker.secure.ca),
        "--device-id",
        DEVICE,
        "--connect-timeout-s",
        COMMAND_TIMEOUT_S,
        *extra,
        "minilm",
        '{"text": "who goes there"}',
    ]


@pytest.fixture(scope="module")
def serving(secure_broker: Mosquitto, module_harness: Harness) -> Mosquitto:
    module_harness.bridge(secure_broker, device_id=DEVICE)
    return secure_broker


def test_a_password_from_a_file_or_the_environment_is_taken_silently(
    serving: Mosquitto, tmp_path: Path
) -> None:
    assert serving.secure is not None
    secret = tmp_path / "mqtt-password"
    secret.write_text(serving.secure.password + "\n")  # as an editor or `echo` leaves it
    secret.chmod(0o600)
    user = {"EDGEINFER_MQTT_USERNAME": serving.secure.username}
    for args, env in [
        (_request(serving, "--password-file", str(secret)), user),
        (_request(serving), {**user, "EDGEINFER_MQTT_PASSWORD_FILE": str(secret)}),
        (_request(serving), {**user, "EDGEINFER_MQTT_PASSWORD": serving.secure.password}),
    ]:
        result = _run(args, env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["ok"] is True
        assert WARNING not in result.stderr


def test_a_password_on_the_command_line_works_with_a_warning(serving: Mosquitto) -> None:
    assert serving.secure is not None
    secure = serving.secure
    result = _run(
        _request(serving, "--username", secure.username, "--password", secure.password), {}
    )
    assert result.returncode == 0, result.stderr
    assert WARNING in result.stderr and "--password-file" in result.stderr
    assert serving.secure.password not in result.stderr


def test_a_password_given_twice_or_an_empty_file_is_a_usage_error(
    serving: Mosquitto, tmp_path: Path
) -> None:
    assert serving.secure is not None
    secret = tmp_path / "mqtt-password"
    secret.write_text(serving.secure.password)
    twice = _run(
        _request(serving, "--username", "edge", "--password-file", str(secret)),
        {"EDGEINFER_MQTT_PASSWORD": serving.secure.password},
    )
    assert twice.returncode == 2 and "(config)" in twice.stderr and "give one" in twice.stderr
    secret.write_text("\n")
    empty = _run(_request(serving, "--username", "edge", "--password-file", str(secret)), {})
    assert empty.returncode == 2 and "empty" in empty.stderr


@pytest.fixture(scope="module")
def signed_package(minilm_int8: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("signed")
    assert main(["keygen", "-o", str(root / "release")]) == 0
    package = root / "minilm"
    shutil.copytree(minilm_int8, package)
    key = str(root / "release.key")
    assert main(["sign", str(package), "--key", key, "--device-id", DEVICE]) == 0
    return package


@pytest.mark.parametrize("command", ["request", "deploy", "rollback", "serve"])
@pytest.mark.parametrize("login", ["none", "wrong password"])
def test_a_refused_login_exits_2_with_broker_auth_at_once(
    secure_broker: Mosquitto, signed_package: Path, command: str, login: str
) -> None:
    assert secure_broker.secure is not None
    tls = ["--broker", secure_broker.url, "--tls-ca", str(secure_broker.secure.ca)]
    device = ["--device-id", DEVICE]
    args = {
        "request": _request(secure_broker),
        "deploy": ["deploy", str(signed_package), *tls, *device, "--timeout-s", COMMAND_TIMEOUT_S],
        "rollback": [
            "rollback",
            "minilm",
            *tls,
            *device,
            "--key",
            str(signed_package.parent / "release.key"),
            "--timeout-s",
            COMMAND_TIMEOUT_S,
        ],
        "serve": ["serve", str(signed_package), *tls, "--device-id", "cli-intruder"],
    }[command]
    env = (
        {}
        if login == "none"
        else {
            "EDGEINFER_MQTT_USERNAME": secure_broker.secure.username,
            "EDGEINFER_MQTT_PASSWORD": "wrong-password-never-logged",
        }
    )
    result = _run(args, env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "(broker_auth)" in result.stderr and "--password-file" in result.stderr
    assert "wrong-password-never-logged" not in result.stdout + result.stderr
