"""kill -9 the broker mid-stream and restart it: every QoS 1 request is answered exactly once.

mosquitto runs with persistence on; the bridge and the client keep persistent sessions (clean
start off, a session expiry). A broker killed with -9 can still lose QoS 1 messages it had
acknowledged but not yet saved, so the client re-sends a request with the same id when no reply
came in time, and the bridge answers a repeated id from its de-duplication store.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from bridge_harness import Harness, Mosquitto, wait_until

REQUESTS = 300
KILL_AT, RESTART_AT = 100, 200  # requests sent before the kill, and before the restart


def test_kill_9_mid_stream_every_request_answered_once(
    own_broker: Mosquitto, harness: Harness
) -> None:
    bridge, counting = harness.bridge(own_broker, device_id="plant", client_id="bridge-plant")
    client = harness.client(own_broker, device_id="plant", client_id="client-plant")
    futures: dict[str, Future[dict[str, Any]]] = {}
    sent = threading.Semaphore(0)

    def stream() -> None:  # a steady sensor stream that does not care about the broker
        for i in range(REQUESTS):
            text = f"reading {i}"
            futures[text] = client.submit(
                "minilm",
                text=text,
                request_id=f"req-{i}",
                attempt_timeout_s=2.0,
                retries=30,
                backoff=1.2,
            )
            sent.release()
            time.sleep(0.001)

    sender = threading.Thread(target=stream)
    sender.start()
    for _ in range(KILL_AT):
        sent.acquire()
    own_broker.kill9()
    for _ in range(RESTART_AT - KILL_AT):
        sent.acquire()
    own_broker.start()
    sender.join()

    replies = {text: future.result(timeout=180) for text, future in futures.items()}
    assert len(replies) == REQUESTS
    assert all(r["ok"] for r in replies.values()), [r for r in replies.values() if not r["ok"]]
    assert all(replies[f"reading {i}"]["id"] == f"req-{i}" for i in range(REQUESTS))
    # Exactly once: the model ran once per request, whatever was redelivered or re-sent.
    assert counting.calls == REQUESTS
    assert set(counting.texts.values()) == {1}
    wait_until(lambda: bridge.connected)
    assert bridge.connects >= 2  # it really lost the broker and came back
