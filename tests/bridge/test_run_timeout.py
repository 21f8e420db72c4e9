"""A request whose graph would run for ever cannot starve the bridge: its run is stopped at the
model's ``run_timeout_s`` (``edgeinfer serve --run-timeout``) or at the request's own deadline,
it is answered ``run_timeout`` / ``deadline_exceeded``, and the worker thread serves on.

A real bridge with ONE worker thread (the worst case: every other request waits behind the
hostile one) over a real mosquitto, two clients: a hostile one sends the spinner package's
endless input (tests/fast_packages.py), a quiet one sends ordinary requests meanwhile. On the
old code the quiet client's requests are never answered: each ``result`` is bounded by the
client's own give-up (``RequestTimeoutError``), so the test fails instead of hanging.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bridge_harness import Mosquitto

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Client, Connection
from edgeinfer.bridge.wire import arrays

X = np.arange(4, dtype=np.float32)[None]  # [1, 4]
# The clients' give-up time: long on purpose (a loaded machine), and never re-sending meanwhile.
GIVE_UP_S = 90.0
QUIET_REQUESTS = 4


def _inputs(x: np.ndarray, *, spin: int) -> dict[str, Any]:
    return {
        "x": arrays.encode_array(x, binary=False),
        "spin": arrays.encode_array(np.full(1, spin, np.int64), binary=False),
    }


@pytest.fixture
def spinner_bridge(
    own_broker: Mosquitto, fast_spinner: Path, request: pytest.FixtureRequest
) -> Iterator[Bridge]:
    run_timeout_s = request.param
    config = edgeinfer.RuntimeConfig(spin_wait=False, run_timeout_s=run_timeout_s)
    with edgeinfer.load(fast_spinner, config=config) as model:
        bridge = Bridge(
            {"spinner": model},
            config=BridgeConfig(
                connection=Connection(broker=own_broker.url, client_id="bridge-spin"),
                device_id="spin",
                metrics_interval_s=0,
                worker_threads=1,
            ),
        )
        bridge.start()
        try:
            yield bridge
        finally:
            _stop_within_bound(bridge)


def _stop_within_bound(bridge: Bridge) -> None:
    """``bridge.stop()`` joins its worker threads: on the old code one still spins in the
    hostile run, so the stop runs in a thread joined with a bound (a failure, never a hang)."""
    stopper = threading.Thread(target=bridge.stop, daemon=True)
    stopper.start()
    stopper.join(GIVE_UP_S)
    assert not stopper.is_alive(), "the bridge could not stop: a worker thread still runs"


def _client(broker: Mosquitto, name: str) -> Client:
    connection = Connection(broker=broker.url, client_id=name)
    return Client(connection=connection, device_id="spin", fmt="json").connect()


def _send(client: Client, *, spin: int, x: np.ndarray, **options: Any) -> Future[dict[str, Any]]:
    return client.submit(
        "spinner",
        fields={"inputs": _inputs(x, spin=spin)},
        attempt_timeout_s=GIVE_UP_S,
        retries=0,
        **options,
    )


def _quiet_ones_answered(quiet: Client) -> list[bool]:
    """The quiet client's requests, sent while the hostile one spins: each answered ok."""
    answers = []
    for i in range(QUIET_REQUESTS):
        x = np.full((1, 4), i, np.float32)
        reply = _send(quiet, spin=0, x=x).result()
        out = arrays.decode_array(reply["result"]["out"], what="out") if reply["ok"] else None
        answers.append(isinstance(out, np.ndarray) and bool(np.array_equal(out, x)))
    return answers


@pytest.mark.parametrize("spinner_bridge", [1.0], indirect=True)
def test_the_hostile_request_is_stopped_and_the_quiet_client_served(
    own_broker: Mosquitto, spinner_bridge: Bridge
) -> None:
    hostile, quiet = _client(own_broker, "hostile"), _client(own_broker, "quiet")
    try:
        endless = _send(hostile, spin=1, x=X)
        assert _quiet_ones_answered(quiet) == [True] * QUIET_REQUESTS
        reply = endless.result()
        assert reply["ok"] is False and reply["error"]["code"] == "run_timeout", reply
        assert "run_timeout_s" in reply["error"]["message"]
        # The worker thread is free again: the hostile client's next ordinary request is served.
        again = _send(hostile, spin=0, x=X).result()
        assert again["ok"] is True
    finally:
        hostile.close()
        quiet.close()


@pytest.mark.parametrize("spinner_bridge", [None], indirect=True)
def test_the_requests_deadline_stops_its_run(own_broker: Mosquitto, spinner_bridge: Bridge) -> None:
    """No run timeout at all: the hostile request's own deadline is what stops it."""
    hostile, quiet = _client(own_broker, "hostile-d"), _client(own_broker, "quiet-d")
    try:
        endless = _send(hostile, spin=1, x=X, timeout_ms=1000)
        assert _quiet_ones_answered(quiet) == [True] * QUIET_REQUESTS
        reply = endless.result()
        assert reply["ok"] is False and reply["error"]["code"] == "deadline_exceeded", reply
        assert "stopped" in reply["error"]["message"] or "not run" in reply["error"]["message"]
    finally:
        hostile.close()
        quiet.close()


def test_serve_run_timeout_flag(own_broker: Mosquitto, fast_spinner: Path, tmp_path: Path) -> None:
    """``edgeinfer serve --run-timeout`` as a real process: the flag reaches the model."""
    command = [sys.executable, "-m", "edgeinfer", "serve", str(fast_spinner)]
    command += ["--broker", own_broker.url, "--device-id", "spin", "--client-id", "serve-spin"]
    command += ["--run-timeout", "0.5", "--metrics-interval-s", "0"]
    with (tmp_path / "serve.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        client = _client(own_broker, "cli-client")
        try:
            inputs = {"inputs": _inputs(X, spin=0)}
            # Re-sends (the same id) cover the bridge's start-up, before it subscribed.
            first = client.submit(
                fast_spinner.name, fields=inputs, attempt_timeout_s=1.0, retries=120, backoff=1.0
            )
            assert first.result()["ok"] is True
            hostile = {"inputs": _inputs(X, spin=1)}
            reply = client.submit(
                fast_spinner.name, fields=hostile, attempt_timeout_s=GIVE_UP_S, retries=0
            ).result()
            assert reply["ok"] is False and reply["error"]["code"] == "run_timeout", reply
            assert "0.500 s" in reply["error"]["message"]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            client.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
