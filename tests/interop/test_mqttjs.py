"""Node.js with MQTT.js (tests/interop/mqttjs_client.mjs) against a real ``edgeinfer serve``:
every request kind and the errors a device meets, on MQTT v5 (matched by CorrelationData) and
3.1.1 (matched by ``id``, or ``raw_id`` when the id was unusable); and a QoS 1 client re-sending
by id across a broker ``kill -9``, answered once per id with replays marked ``"replay": true``."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_harness import (
    DEVICE,
    HANG_S,
    HERE,
    NODE,
    Served,
    camera_jpeg,
    ends_at_once,
    expected_label,
    first_messages,
    require_mqttjs,
    run_mqttjs,
    start_serve,
)
from mosquitto import Mosquitto, running_mosquitto

import edgeinfer

CHAT = [{"role": "user", "content": "Is valve 7 open?"}]


def plan(served: Served, protocol: int, client_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "url": served.broker.url,
        "protocol": protocol,
        "clientId": client_id,
        "device": DEVICE,
        **fields,
    }


@pytest.mark.parametrize("protocol", [5, 4], ids=["v5", "v311"])
def test_every_kind_and_error_from_mqttjs(
    served: Served, protocol: int, smollm2: Path, effnet_fp32: Path, minilm_classifier: Path
) -> None:
    p = f"js{protocol}"
    jpeg = camera_jpeg()
    quiet = ends_at_once(smollm2)
    requests = [
        ("minilm-int8", {"id": f"{p}-embed", "text": "pressure rising fast"}),
        ("minilm-classify", {"id": f"{p}-classify", "text": "the match ended in a draw"}),
        ("effnet-fp32", {"id": f"{p}-image", "image": {"format": "jpeg", "data": jpeg}}),
        ("smollm2", {"id": f"{p}-stream", "prompt": "The valve", "max_new_tokens": 24}),
        ("smollm2", {"id": f"{p}-final", "prompt": "The valve", "stream": False}),
        ("smollm2", {"id": f"{p}-chat", "prompt": CHAT[0]["content"], "chat": True}),
        ("smollm2", {"id": f"{p}-messages", "messages": CHAT}),
        ("smollm2", {"id": f"{p}-quiet", "prompt": quiet}),
        ("smollm2", {"id": f"{p}-quiet-chat", "prompt": quiet, "chat": True}),
        ("smollm2", {"id": f"{p}-cancel", "cancel": "never-sent"}),
        ("nope", {"id": f"{p}-unknown", "text": "x"}),
        ("smollm2", {"id": f"{p}-kind", "text": "a text to a generate model"}),
    ]
    # An id that is a number: matched by CorrelationData on v5, by raw_id on 3.1.1.
    number_id = 12340 + protocol
    number_key = f"{p}-number" if protocol == 5 else str(number_id)
    broken = f'{{"id": "{p}-broken", "text": '  # not JSON; the id is still readable
    extra = [
        {"model": "minilm-int8", "body": {"id": number_id, "text": "x"}, "key": number_key},
        {"model": "minilm-int8", "body": broken, "key": f"{p}-broken"},
    ]
    out = run_mqttjs(
        plan(
            served,
            protocol,
            f"mqttjs-{p}",
            mode="requests",
            requests=[{"model": m, "body": b} for m, b in requests] + extra,
        )
    )
    final = {key: messages[-1] for key, messages in out.items()}
    assert len(final[f"{p}-embed"]["result"][0]) == 384
    classifier = edgeinfer.load(minilm_classifier, config=edgeinfer.RuntimeConfig(spin_wait=False))
    want = classifier.classify(["the match ended in a draw"])[0].label
    assert final[f"{p}-classify"]["result"][0]["label"] == want
    assert final[f"{p}-image"]["result"][0]["label"] == expected_label(effnet_fp32, jpeg)
    # Streaming: chunks numbered from 0, in order, adding up to the final text.
    chunks, last = out[f"{p}-stream"][:-1], out[f"{p}-stream"][-1]
    assert (
        [c["chunk"] for c in chunks]
        == list(range(len(chunks)))
        == list(range(last["result"]["chunks"]))
    )
    assert "".join(c["text"] for c in chunks) == last["result"]["text"]
    # "stream": false: the final message only, the same text as streamed (greedy).
    assert out[f"{p}-final"] == [out[f"{p}-final"][0]] and out[f"{p}-final"][0]["done"]
    # "chat": true is the prompt as one user message.
    assert final[f"{p}-chat"]["result"]["text"] == final[f"{p}-messages"]["result"]["text"]
    # A bare prompt a chat model ends at once says why; the same as chat does not end so.
    assert "chat" in final[f"{p}-quiet"]["result"]["hint"]
    assert "hint" not in final[f"{p}-quiet-chat"]["result"]
    assert final[f"{p}-cancel"]["result"] == {"cancelled": "never-sent", "state": "unknown"}
    assert final[f"{p}-unknown"]["error"]["code"] == "unknown_model"
    assert final[f"{p}-kind"]["error"]["code"] == "wrong_kind"
    number = final[number_key]
    assert number["id"] is None and number["raw_id"] == str(number_id)
    assert number["error"]["code"] == "bad_request"
    assert final[f"{p}-broken"]["raw_id"] == f"{p}-broken"


def test_mqttjs_resends_by_id_across_a_broker_kill_9(tmp_path: Path, minilm_int8: Path) -> None:
    """A QoS 1 MQTT.js client with a persistent session sends 40 requests one after another,
    re-sending an id after 2 s without its answer; mosquitto is killed (-9) and restarted
    after the 10th answer. Every id is answered, the model ran once per id (the bridge's
    ``ok`` count), and every answer the client got twice was marked ``"replay": true`` or
    was the broker delivering the same message again (byte for byte)."""
    require_mqttjs()
    assert NODE is not None
    count = 40
    with running_mosquitto(tmp_path / "mosquitto") as broker:
        served = start_serve(
            broker, [minilm_int8], tmp_path / "serve.log", "--metrics-interval-s", "0.5"
        )
        try:
            job = {
                "url": broker.url,
                "protocol": 5,
                "clientId": "mqttjs-restart",
                "device": DEVICE,
                "mode": "resend",
                "model": "minilm-int8",
                "count": count,
                "resendMs": 2000,
            }
            with subprocess.Popen(
                [NODE, str(HERE / "mqttjs_client.mjs"), json.dumps(job)],
                stdout=subprocess.PIPE,
                text=True,
            ) as node:
                assert node.stdout is not None
                lines = []
                for line in node.stdout:
                    lines.append(json.loads(line))
                    if lines[-1].get("answered") == 10:
                        broker.kill9()
                        broker.start()
                assert node.wait(timeout=HANG_S) == 0
            summary = lines[-1]
            assert summary["finals"] == count
            # An answer that came twice is a replay from the store or the same message again.
            assert summary["unexplained"] == 0, summary
            metrics = _metrics(broker)
            assert metrics["counts"]["ok"] == count  # the model ran once per id
        finally:
            assert served.stop() == 0


def _metrics(broker: Mosquitto) -> dict[str, Any]:
    """The next metrics message (every 0.5 s)."""
    return json.loads(first_messages(broker.port, f"edgeinfer/{DEVICE}/metrics")[0])


def test_base64_vectors_are_the_runtime_vectors(served: Served, minilm_int8: Path) -> None:
    out = run_mqttjs(
        plan(
            served,
            5,
            "mqttjs-b64",
            mode="requests",
            requests=[
                {
                    "model": "minilm-int8",
                    "body": {"id": "b64-1", "text": "pump 4", "encoding": "float32-base64"},
                }
            ],
        )
    )
    (reply,) = out["b64-1"]
    model = edgeinfer.load(minilm_int8, config=edgeinfer.RuntimeConfig(spin_wait=False))
    want = np.asarray(model.embed(["pump 4"])[0], np.float32)
    assert np.array_equal(np.frombuffer(base64.b64decode(reply["result"][0]), "<f4"), want)
