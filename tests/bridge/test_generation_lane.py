"""The generation lane reads the runtime's finish reason; it never decides one a second time.

The lane passes ``stop=`` and the deadline down and takes the reason from the stream's last
chunk (the runtime's contract, followed by ``FakeDecoder``); cancel closes the stream. The
clock is injected, so the race of the old lane (it checked the deadline itself after the last
token, before the length: a generation that stopped at ``max_new_tokens`` with the deadline
passing right after was reported ``deadline``) is reproduced exactly, without sleeping.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from bridge_harness import FakeClock
from fake_models import FakeDecoder

from edgeinfer.bridge.serve.replies import Outgoing
from edgeinfer.bridge.serve.worker import Worker
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto


def _run(model: Any, clock: FakeClock, **given: Any) -> list[dict[str, Any]]:
    """One generation of ``model`` through a worker; every message it sent, decoded."""
    sent: list[Outgoing] = []
    worker = Worker({"gen": model}, send=sent.append, clock_ms=clock)
    worker.start()
    deadline = given.pop("timeout_ms", None)
    worker.submit(
        proto.Request(
            id="g",
            model="gen",
            kind="generate",
            input=kinds.GenerateInput(**given),
            deadline_ms=None if deadline is None else clock() + deadline,
            reply_to="edgeinfer/clients/a/reply",
            received_ms=clock(),
        )
    )
    worker.stop(timeout_s=30)
    return [json.loads(out.payload) for out in sent]


def test_length_stays_length_when_the_deadline_passes_right_after_the_last_token() -> None:
    clock = FakeClock()
    last = 2

    def after(i: int) -> None:  # the clock passes the deadline once the last token is out
        if i == last:
            clock.advance(500)

    model = FakeDecoder(words=["valve", "is", "open"], on_token=after)
    *chunks, final = _run(model, clock, prompt="x", max_new_tokens=3, timeout_ms=100)
    assert final["result"]["stop_reason"] == "length"  # the old lane said "deadline"
    assert final["result"]["text"] == "valve is open" == "".join(c["text"] for c in chunks)
    assert model.calls[0]["timeout_s"] == 0.1  # the deadline went down to the runtime


def test_stop_strings_are_the_runtimes_and_its_reason_is_the_answer() -> None:
    model = FakeDecoder(words=["pump", "off.", "END", "more"])
    *chunks, final = _run(
        FakeDecoder.__call__ if False else model, FakeClock(), prompt="x", stop=("END",)
    )
    assert model.calls[0]["stop"] == ["END"]
    assert final["result"]["stop_reason"] == "stop"
    assert final["result"]["text"] == "pump off. " == "".join(c["text"] for c in chunks)


def test_cancel_closes_the_stream_and_says_cancelled() -> None:
    started, release = threading.Event(), threading.Event()

    def hold(i: int) -> None:
        if i == 0:
            started.set()
            assert release.wait(30)

    model = FakeDecoder(words=["a", "b", "c", "d"], on_token=hold)
    sent: list[Outgoing] = []
    worker = Worker({"gen": model}, send=sent.append)
    worker.start()
    client = "edgeinfer/clients/a/reply"
    generate = proto.Request(
        id="g", model="gen", kind="generate", input=kinds.GenerateInput("x"), reply_to=client
    )
    worker.submit(generate)
    assert started.wait(30)
    cancel = proto.Request(
        id="c", model="gen", kind="cancel", input=kinds.CancelInput("g"), reply_to=client
    )
    worker.submit(cancel)
    release.set()
    worker.stop(timeout_s=30)
    finals = {m["id"]: m for m in (json.loads(o.payload) for o in sent if o.final)}
    assert finals["c"]["result"] == {"cancelled": "g", "state": "running"}
    assert finals["g"]["result"]["stop_reason"] == "cancelled"
    assert finals["g"]["result"]["text"] == "a b"  # the token taken with the cancel pending
    assert model.closed == 1  # the stream was closed: the runtime cancels its sequence
