"""The one reply guard: every request leaves the worker through exactly one final reply.

A property test drives the worker alone (no broker) through every error path at once: an
undecodable message, an unknown model, a wrong kind, a cancel, a re-send while pending and
after the answer, an id reused for other content, a deadline passed on arrival and in the
queue, a full queue, a push-out, a per-client cap, a reply-cache hit, and models raising a
caller error, an engine error and a bug (a generation: after its first chunk). Whatever the
order, each message gets one final reply (a re-send of a pending request: none, its twin's
answers it), no chunk comes after a final, every reply names the request's identity, and no
identity is left pending.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from bridge_harness import FakeClock
from fake_models import FakeDecoder, FakeEncoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeinfer.bridge.serve.guard import Ticket
from edgeinfer.bridge.serve.replies import DedupStore, Outgoing, Stored
from edgeinfer.bridge.serve.worker import Worker
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto

CLIENTS = ("edgeinfer/clients/a/reply", "edgeinfer/clients/b/reply")
KINDS = ("text", "generate", "cancel", "undecodable", "unknown_model", "wrong_kind")
TEXTS = ("ok", "okay two", "raise:input", "raise:engine", "raise:bug")


@dataclass(frozen=True)
class Message:
    kind: str  # text, generate, cancel, undecodable, unknown_model, wrong_kind
    client: str
    ident: str
    text: str
    expired: bool

    def decoded(self, i: int, now_ms: float) -> proto.Request | proto.ErrorReply:
        correlation = f"m{i}".encode()
        if self.kind == "undecodable":
            return proto.ErrorReply(
                proto.BAD_REQUEST, "not JSON", reply_to=self.client, correlation=correlation
            )
        given: kinds.Input = kinds.TextInput((self.text,))
        kind, model = "text", {"unknown_model": "nope", "wrong_kind": "gen"}.get(self.kind, "enc")
        if self.kind == "generate":
            kind, model, given = "generate", "gen", kinds.GenerateInput(f"{self.text} and so")
        elif self.kind == "cancel":
            kind, model, given = "cancel", "gen", kinds.CancelInput(self.ident)
        return proto.Request(
            id=self.ident,
            model=model,
            kind=kind,
            input=given,
            deadline_ms=now_ms - 1 if self.expired else None,
            reply_to=self.client,
            correlation=correlation,
            received_ms=now_ms,
        )


messages = st.builds(
    Message,
    kind=st.sampled_from(KINDS),
    client=st.sampled_from(CLIENTS),
    ident=st.sampled_from(["x", "y", "z"]),
    text=st.sampled_from(TEXTS),
    expired=st.sampled_from([False, False, False, True]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(messages, min_size=1, max_size=14),
    paused=st.booleans(),
    caps=st.sampled_from([None, 1, 2]),
    cache=st.booleans(),
)
def test_every_message_leaves_with_exactly_one_final_reply(
    batch: list[Message], paused: bool, caps: int | None, cache: bool
) -> None:
    sent: list[Outgoing] = []
    lock = threading.Lock()

    def send(out: Outgoing) -> None:
        with lock:
            sent.append(out)

    clock = FakeClock()
    worker = Worker(
        {"enc": FakeEncoder(), "gen": FakeDecoder()},
        send=send,
        max_queue=2,
        max_generate_queue=1,
        clock_ms=clock,
        reply_cache_bytes=1 << 20 if cache else 0,
        max_client_requests=caps,
        max_client_generations=caps,
    )
    worker.start()
    if paused:
        worker.pause()  # the queue fills: busy, push-outs and caps
    decoded = [m.decoded(i, clock()) for i, m in enumerate(batch)]
    for item in decoded:
        worker.submit(item)
    worker.stop(timeout_s=30)

    finals: defaultdict[int, list[Outgoing]] = defaultdict(list)
    for out in sent:
        i = int(out.correlation.decode()[1:]) if out.correlation else -1
        assert out.final or not finals[i], "a chunk after the final reply"
        if out.final:
            finals[i].append(out)
        item = decoded[i]
        assert out.key == (item.key if isinstance(item, proto.Request) else None)
    silent = [i for i in range(len(batch)) if not finals[i]]
    assert all(len(finals[i]) <= 1 for i in range(len(batch)))
    assert len(silent) == worker.counts["duplicate_dropped"]
    for i in silent:  # a re-send of a pending request: the first one's reply answered it
        item = decoded[i]
        assert isinstance(item, proto.Request)
        assert any(
            isinstance(d, proto.Request) and d.key == item.key and d.input == item.input
            for d in decoded[:i]
        )
    for i, outs in finals.items():
        if i >= 0 and outs:
            _assert_own_answer(batch[i], json.loads(outs[0].payload))
    assert not worker.dedup._pending  # no identity is left claimed


def _assert_own_answer(message: Message, reply: dict[str, Any]) -> None:
    """A success is the answer to this message's own input (never another request's)."""
    if not reply["ok"] or message.kind == "cancel":
        return
    if message.kind == "text":
        assert reply["result"] == [[float(len(message.text))]]
    elif reply["result"]["stop_reason"] != "cancelled":  # cancelled: maybe before it raised
        assert reply["result"]["text"] == f"{message.text} and so"
        assert not message.text.startswith("raise:")


def _ticket(sent: list[Outgoing]) -> Ticket:
    request = proto.Request(
        id="t", model="m", kind="text", input=kinds.TextInput(("a",)), reply_to="r"
    )
    return Ticket(request, send=sent.append, count=lambda name: None)


def test_a_stage_that_forgets_to_reply_answers_internal() -> None:
    sent: list[Outgoing] = []
    ticket = _ticket(sent)
    store = DedupStore(4)
    ticket.claim(store, b"digest")
    with ticket.hold():
        pass  # neither replied nor passed on: a bug the guard answers
    assert [json.loads(o.payload)["error"]["code"] for o in sent] == ["internal"]
    assert store.claim(("r", "m", "t"), b"digest") == "run"  # released, not stuck pending


def test_a_second_final_reply_is_never_sent() -> None:
    sent: list[Outgoing] = []
    ticket = _ticket(sent)
    ticket.answer(Stored({"ok": True}))
    ticket.fail(proto.INTERNAL, "late")
    ticket.chunk(b"late chunk")
    assert len(sent) == 1 and sent[0].final and sent[0].key == ("r", "m", "t")


def test_an_exception_in_a_stage_is_its_one_reply() -> None:
    sent: list[Outgoing] = []
    ticket = _ticket(sent)
    with ticket.hold() as hold:
        hold.pass_on()  # queued, then the stage failed: the error is the reply
        raise RuntimeError("boom")
    with ticket.hold():
        ticket.answer(Stored({"ok": True}))  # the next stage's reply is refused
    assert [json.loads(o.payload).get("ok") for o in sent] == [False]
