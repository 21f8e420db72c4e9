"""Debian's mosquitto-clients against a real ``edgeinfer serve``: what docs/mqtt.md's shell
examples do not show — an image from a file, a classifier, a cancelled generation, and the
error replies a 3.1.1 shell client can match (by ``raw_id``) — on MQTT v5 and 3.1.1."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from interop_harness import (
    DEVICE,
    HANG_S,
    LOOPBACK,
    PUB,
    SUB,
    Served,
    camera_jpeg,
    expected_label,
    require_shell_clients,
    rr,
)


def _request(protocol: str, model: str, request_id: str) -> list[str]:
    """mosquitto_rr arguments for one request to ``model`` (3.1.1: reply_to in the payload)."""
    reply = f"edgeinfer/{DEVICE}/reply/{request_id}"
    return ["-V", protocol, "-t", f"edgeinfer/{DEVICE}/{model}/req", "-e", reply]


@pytest.mark.parametrize("protocol", ["5", "311"])
def test_an_image_file_from_the_shell(
    served: Served, protocol: str, effnet_fp32: Path, tmp_path: Path
) -> None:
    """A JPEG file, base64-encoded into a request by the shell and sent by mosquitto_rr
    (as ``-m "$(cat request.json)"``: Debian 12's mosquitto_rr 2.0.11 sends ``-f``/``-s``
    requests empty)."""
    require_shell_clients()
    (tmp_path / "frame.b64").write_text(camera_jpeg())
    request_id = f"sh-image-{protocol}"
    reply_to = f', "reply_to": "edgeinfer/{DEVICE}/reply/{request_id}"' if protocol == "311" else ""
    args = " ".join(_request(protocol, "effnet-fp32", request_id))
    script = (
        f'printf \'{{"id": "{request_id}"{reply_to}, "image": {{"format": "jpeg", '
        f'"data": "%s"}}}}\' "$(cat frame.b64)" > request.json\n'
        f'mosquitto_rr -h {LOOPBACK} -p {served.broker.port} {args} -m "$(cat request.json)" '
        f"-W {HANG_S}"
    )
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_S + 10,
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["ok"], reply["error"]
    label = expected_label(effnet_fp32, (tmp_path / "frame.b64").read_text())
    assert reply["result"][0]["label"] == label


def test_classify_and_the_311_errors_a_shell_can_match(served: Served) -> None:
    port = served.broker.port
    (label,) = rr(
        port,
        *_request("5", "minilm-classify", "sh-cls"),
        *("-m", json.dumps({"id": "sh-cls", "text": "the match ended in a draw"})),
    )
    assert label["ok"] and set(label["result"][0]["scores"]) >= {label["result"][0]["label"]}
    # 3.1.1, an id too long to use: the reply (at reply_to) carries its first 200 characters.
    long_id = "x" * 300
    topic = f"edgeinfer/{DEVICE}/reply/sh-long"
    (too_long,) = rr(
        port,
        *_request("311", "minilm-int8", "sh-long"),
        *("-m", json.dumps({"id": long_id, "text": "a", "reply_to": topic})),
    )
    assert too_long["id"] is None and too_long["raw_id"] == long_id[:200]
    assert too_long["error"]["code"] == "bad_request"


def test_errors_without_a_reply_topic_reach_the_errors_topic(served: Served) -> None:
    """3.1.1: a payload the bridge cannot parse names no reply topic it can read; its answer goes
    to P/D/errors, with the id found in its first bytes."""
    assert PUB is not None and SUB is not None
    port, errors = str(served.broker.port), f"edgeinfer/{DEVICE}/errors"
    session = ["-V", "311", "-c", "-i", "sh-errors", "-q", "1", "-t", errors]
    subprocess.run([SUB, "-h", LOOPBACK, "-p", port, *session, "-E"], check=True, timeout=HANG_S)
    oversize = '{"id": "sh-big", "text": "' + "y" * 300_000 + '"}'
    request = f"edgeinfer/{DEVICE}/minilm-int8/req"
    for payload in ('{"id": "sh-cut", "text": ', oversize):
        subprocess.run(
            [PUB, "-h", LOOPBACK, "-p", port, "-V", "311", "-q", "1", "-s", "-t", request],
            input=payload.encode(),
            check=True,
            timeout=HANG_S,
        )
    done = subprocess.run(
        [SUB, "-h", LOOPBACK, "-p", port, *session, "-C", "2", "-W", str(HANG_S)],
        capture_output=True,
        check=True,
        timeout=HANG_S + 10,
    )
    cut, big = (json.loads(line) for line in done.stdout.splitlines())
    assert (cut["raw_id"], cut["error"]["code"]) == ("sh-cut", "bad_request")
    assert (big["raw_id"], big["error"]["code"]) == ("sh-big", "payload_too_large")


def test_cancel_a_queued_generation_from_the_shell(served: Served) -> None:
    """Three generations queued back to back (``"stream": false``: one message each), then a
    cancel of the last: whatever the timing, the cancel's ``state`` and that generation's final
    message agree. The finals wait in a persistent session until read."""
    assert PUB is not None and SUB is not None
    port = str(served.broker.port)
    reply = f"edgeinfer/{DEVICE}/reply/sh-gen"
    session = ["-c", "-i", "sh-gen", "-q", "1", "-t", reply]
    subprocess.run([SUB, "-h", LOOPBACK, "-p", port, *session, "-E"], check=True, timeout=HANG_S)
    for n in range(3):
        body = {"id": f"sh-gen-{n}", "prompt": "The valve", "max_new_tokens": 200, "stream": False}
        publish = ("-q", "1", "-t", f"edgeinfer/{DEVICE}/smollm2/req", "-m", json.dumps(body))
        subprocess.run(
            [PUB, "-h", LOOPBACK, "-p", port, *publish, "-D", "publish", "response-topic", reply],
            check=True,
            timeout=HANG_S,
        )
    (cancel,) = rr(
        served.broker.port,
        *_request("5", "smollm2", "sh-cancel"),
        *("-m", json.dumps({"id": "sh-cancel", "cancel": "sh-gen-2"})),
    )
    state = cancel["result"]["state"]
    assert state in ("queued", "running", "unknown")
    done = subprocess.run(
        [SUB, "-h", LOOPBACK, "-p", port, *session, "-C", "3", "-W", str(HANG_S)],
        capture_output=True,
        check=True,
        timeout=HANG_S + 10,
    )
    finals = {m["id"]: m for m in map(json.loads, done.stdout.splitlines())}
    assert set(finals) == {"sh-gen-0", "sh-gen-1", "sh-gen-2"}
    reason = finals["sh-gen-2"]["result"]["stop_reason"]
    assert (reason == "cancelled") == (state != "unknown"), (state, finals["sh-gen-2"])
