"""Interop harness: a real ``edgeinfer serve`` process behind a real mosquitto, and the non-Python
clients that talk to it (Debian's mosquitto-clients, Node.js with MQTT.js from package.json here).

``tools/setup.sh`` installs both: ``apt-get install mosquitto-clients`` and ``npm ci`` in this
folder. A test skips, saying why, only when the ``mosquitto_rr`` binary or ``node`` is missing; with
node present but MQTT.js not installed it fails (run ``npm ci`` here).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mosquitto import LOOPBACK, Mosquitto, running_mosquitto

HERE = Path(__file__).resolve().parent
NODE = shutil.which("node")
MQTTJS = HERE / "node_modules" / "mqtt"
RR, PUB, SUB = (shutil.which(n) for n in ("mosquitto_rr", "mosquitto_pub", "mosquitto_sub"))
DEVICE = "plc7"  # the docs' device id
DOCS = HERE.parents[1] / "docs" / "mqtt.md"
_BLOCK = re.compile(r"<!-- run: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.DOTALL)
# How long a test waits for a process that must answer at once (a hang guard, not a timing).
HANG_S = 120


def require_shell_clients() -> None:
    if None in (RR, PUB, SUB):
        pytest.skip("mosquitto_rr/pub/sub are not installed (apt-get install mosquitto-clients)")


def require_mqttjs() -> None:
    if NODE is None:
        pytest.skip("node is not installed: the MQTT.js interop tests need Node.js")
    if not MQTTJS.is_dir():
        pytest.fail("MQTT.js is not installed: run `npm ci` in tests/interop (tools/setup.sh does)")


def run_mqttjs(plan: dict[str, Any], *, timeout_s: float = HANG_S) -> Any:
    """Run mqttjs_client.mjs with ``plan``; its last stdout line, parsed."""
    require_mqttjs()
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(HERE / "mqttjs_client.mjs"), json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def rr(port: int, *args: str, stdin: str | None = None) -> list[dict[str, Any]]:
    """``mosquitto_rr -h 127.0.0.1 -p PORT ARGS``: the reply it printed, parsed (one a line)."""
    require_shell_clients()
    assert RR is not None
    done = subprocess.run(
        [RR, "-h", LOOPBACK, "-p", str(port), "-W", str(HANG_S), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=HANG_S + 10,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def first_messages(port: int, topic: str, *, count: int = 1, verbose: bool = False) -> list[bytes]:
    """The first ``count`` messages on ``topic`` (a retained one comes at once), raw;
    ``verbose``: each line is ``TOPIC PAYLOAD``."""
    require_shell_clients()
    assert SUB is not None
    args = ["-t", topic, "-C", str(count), "-W", str(HANG_S), *(["-v"] if verbose else [])]
    done = subprocess.run(
        [SUB, "-h", LOOPBACK, "-p", str(port), *args], capture_output=True, timeout=HANG_S + 10
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def wait_for(
    port: int, topic: str, done: Callable[[bytes], bool], *, client_args: Sequence[str] = ()
) -> bool:
    """Read ``topic`` (its retained message first) until ``done(payload)``; False when
    mosquitto_sub gave up (the hang guard) first."""
    require_shell_clients()
    assert SUB is not None
    args = [*client_args, "-t", topic, "-W", str(HANG_S)]
    with subprocess.Popen(
        [SUB, "-h", LOOPBACK, "-p", str(port), *args], stdout=subprocess.PIPE
    ) as sub:
        assert sub.stdout is not None
        for line in sub.stdout:
            if done(line.rstrip(b"\n")):
                sub.terminate()
                return True
    return False


@dataclass
class Served:
    """One ``edgeinfer serve`` process; ``client_args`` log mosquitto_sub in (TLS, user);
    ``status``: its status topic (``P/D/status/CLIENT_ID`` in a shared group)."""

    proc: subprocess.Popen[bytes]
    broker: Mosquitto
    log: Path
    client_args: Sequence[str] = ()
    status: str = f"edgeinfer/{DEVICE}/status"

    def wait_online(self) -> None:
        """Until the status says online (the bridge subscribed before publishing it)."""
        online = wait_for(
            self.broker.port,
            self.status,
            lambda payload: json.loads(payload)["state"] == "online",
            client_args=self.client_args,
        )
        if not online:
            pytest.fail(f"edgeinfer serve did not come online: {self.log.read_text()[-3000:]}")

    def kill9(self) -> None:
        """``kill -9``: no goodbye, the broker speaks its Wills."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def start_serve(
    broker: Mosquitto,
    packages: Sequence[Path],
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    client_args: Sequence[str] = (),
    status: str = f"edgeinfer/{DEVICE}/status",
) -> Served:
    """``edgeinfer serve PACKAGES --device-id plc7 ARGS`` on ``broker``, online."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgeinfer",
                "serve",
                *map(str, packages),
                "--broker",
                broker.url,
                "--device-id",
                DEVICE,
                "--threads",
                "1",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    served = Served(proc, broker, log, client_args, status)
    served.wait_online()
    return served


GROUP = "workers"  # the shared group of the group tests, and its members' client ids
MEMBERS = ("bridge-a", "bridge-b")


def start_member(broker: Mosquitto, package: Path, folder: Path, member: str) -> Served:
    """One member of the shared group: its own client id, state folder and log."""
    return start_serve(
        broker,
        [package],
        folder / f"{member}.log",
        *("--shared-group", GROUP, "--client-id", member, "--availability"),
        *("--ha-discovery", "homeassistant", "--metrics-interval-s", "0.5"),
        env={"EDGEINFER_STATE_DIR": str(folder / member)},
        status=f"edgeinfer/{DEVICE}/status/{member}",
    )


@contextmanager
def running_group(folder: Path, package: Path) -> Iterator[tuple[Mosquitto, dict[str, Served]]]:
    """A mosquitto and the two members of the shared group serving ``package`` on it (a test
    may replace a member it restarted); every member stopped afterwards."""
    with running_mosquitto(folder / "mosquitto") as broker:
        members = {m: start_member(broker, package, folder, m) for m in MEMBERS}
        try:
            yield broker, members
        finally:
            for served in members.values():
                served.stop()


def blocks() -> dict[str, tuple[str, str]]:
    """NAME -> (language, text) of every runnable block of docs/mqtt.md: a fenced block right
    after ``<!-- run: NAME -->``."""
    found = _BLOCK.findall(DOCS.read_text())
    names = [name for name, _, _ in found]
    assert len(names) == len(set(names)), f"two runnable blocks share a name: {names}"
    return {name: (lang, text) for name, lang, text in found}


def camera_jpeg() -> str:
    """A real photo (scikit-learn's sample, halved to 320x213) as a base64 JPEG."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photo = Image.fromarray(load_sample_images().images[1]).reduce(2)
    buffer = io.BytesIO()
    photo.save(buffer, format="JPEG", quality=90)
    return base64.b64encode(buffer.getvalue()).decode()


def expected_label(package: Path, jpeg: str) -> str:
    """The label the runtime gives the decoded JPEG, prepared as the bridge prepares it."""
    from PIL import Image

    import edgeinfer
    from edgeinfer.bridge.wire.frames import frames_to_batch
    from edgeinfer.package_io import ImageClassifierIO

    model = edgeinfer.load(package, threads=1)
    frame = np.asarray(Image.open(io.BytesIO(base64.b64decode(jpeg))).convert("RGB"))
    spec = model.manifest.io_as(ImageClassifierIO).image
    return str(model.classify(frames_to_batch([frame], image=spec))[0].label)


def ends_at_once(package: Path) -> str:
    """A prompt the (random) chat model answers with an immediate end of turn, as an instruct
    model often does to a bare prompt: found by trying a few, greedy, through the runtime."""
    import edgeinfer

    model = edgeinfer.load(package, threads=1)
    candidates = ["<|im_end|>", "a a <|endoftext|>", "<|im_end|>\n", "<|endoftext|>"]
    for prompt in candidates:
        result = model.generate(prompt, max_new_tokens=1)
        if not result.token_ids and result.finish_reason == "eos":
            return prompt
    pytest.fail(f"the tiny model answers none of {candidates} with an immediate end")
