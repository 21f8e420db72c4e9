"""Every shell command and script of docs/mqtt.md, run as written against a real ``edgeinfer
serve`` and a real mosquitto, so the docs cannot drift.

A runnable block is a fenced ``sh``, ``js`` or ``conf`` block right after an HTML comment
``<!-- run: NAME -->``. Only the broker's port changes (``1883`` -> the test broker's). The
``conf`` blocks are started by test_broker_configs.py; the rest are run here, each checked for
what the docs say it prints.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_harness import (
    DOCS,
    HANG_S,
    HERE,
    NODE,
    Served,
    blocks,
    require_mqttjs,
    require_shell_clients,
)

import edgeinfer

# Started by test_broker_configs.py (mosquitto configurations, the ACL, the password file,
# the TLS certificates).
BROKER_BLOCKS = {"acl", "mosquitto-plain", "mosquitto-passwd", "mosquitto-tls", "tls-certs"}


def localize(text: str, port: int) -> str:
    """The docs' text with the test broker's port for the default one."""
    return text.replace("1883", str(port))


def run_shell(text: str, port: int, cwd: Path) -> list[str]:
    require_shell_clients()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", localize(text, port)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def run_js(name: str, text: str, port: int, cwd: Path) -> list[str]:
    """A docs script as an ES module beside a node_modules that resolves ``mqtt``."""
    require_mqttjs()
    assert NODE is not None
    script = cwd / f"{name}.mjs"
    script.write_text(localize(text, port))
    if not (cwd / "node_modules").exists():
        (cwd / "node_modules").symlink_to(HERE / "node_modules")
    done = subprocess.run(
        [NODE, str(script)], cwd=cwd, capture_output=True, text=True, timeout=HANG_S
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def vector(minilm_int8: Path) -> np.ndarray:
    """The embedding the docs' commands ask for, computed here by the runtime."""
    model = edgeinfer.load(minilm_int8, config=edgeinfer.RuntimeConfig(spin_wait=False))
    return np.asarray(model.embed(["pressure rising fast"])[0], np.float32)


def test_every_shell_and_js_block_is_runnable_and_run() -> None:
    text = DOCS.read_text()
    fenced = re.findall(r"^```(sh|js|conf)\n", text, re.MULTILINE)
    found = blocks()
    assert len(fenced) == len(found), "a sh/js/conf block in docs/mqtt.md has no run marker"
    assert set(found) == set(CHECKS) | BROKER_BLOCKS


def _embed(lines: list[str], vector: np.ndarray, **_: Any) -> None:
    (reply,) = map(json.loads, lines)
    assert reply["ok"] and reply["id"] == "sh-1"
    assert np.array_equal(np.asarray(reply["result"][0], np.float32), vector)


def _embed_311(lines: list[str], vector: np.ndarray, **_: Any) -> None:
    (reply,) = map(json.loads, lines)
    assert reply["ok"] and reply["id"] == "sh-2"
    assert np.array_equal(np.frombuffer(base64.b64decode(reply["result"][0]), "<f4"), vector)


def _generate(lines: list[str], rerun: Callable[[], list[str]], **_: Any) -> None:
    (final,) = map(json.loads, lines)  # "stream": false: the final message only
    assert final["ok"] and final["done"] and final["result"]["chunks"] == 0
    assert final["result"]["completion_tokens"] > 0 and "replay" not in final
    (again,) = map(json.loads, rerun())  # the same id: from the de-duplication store
    assert again["replay"] is True and again["result"] == final["result"]


def _later(lines: list[str], **_: Any) -> None:
    reply = json.loads(lines[-1])
    assert reply["ok"] and reply["id"] == "sh-4" and len(reply["result"][0]) == 384


def _cancel_status(lines: list[str], **_: Any) -> None:
    cancel, status = map(json.loads, lines)
    assert cancel["ok"] and cancel["result"] == {"cancelled": "sh-3", "state": "unknown"}
    assert status["state"] == "online" and {"minilm-int8", "smollm2"} <= set(status["models"])


def _mqttjs_v5(lines: list[str], **_: Any) -> None:
    embed, generate = lines
    assert embed == "embed true 384"
    assert re.fullmatch(r"generate (eos|length) true", generate), generate  # streamed == final


def _mqttjs_311(lines: list[str], **_: Any) -> None:
    assert lines == ["embed true 384"]


CHECKS: dict[str, Callable[..., None]] = {
    "shell-embed": _embed,
    "shell-embed-311": _embed_311,
    "shell-generate": _generate,
    "shell-later": _later,
    "shell-cancel-status": _cancel_status,
    "mqttjs-v5": _mqttjs_v5,
    "mqttjs-311": _mqttjs_311,
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_docs_block_runs_as_written(
    name: str, served: Served, vector: np.ndarray, tmp_path: Path
) -> None:
    lang, text = blocks()[name]
    port = served.broker.port
    if lang == "js":
        lines = run_js(name, text, port, tmp_path)
    else:
        lines = run_shell(text, port, tmp_path)
    assert lines, f"the {name} block printed nothing"
    # The order of the parametrized runs is the docs' order: sh-5 cancels sh-3, answered.
    CHECKS[name](lines, vector=vector, rerun=lambda: run_shell(text, port, tmp_path))
