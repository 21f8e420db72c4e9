"""The request journal (real SQLite files, reopened as a restarted bridge would) and the
delivery rules on it: what is re-run at a start, what is refused, what a duplicate gets, and
that an answer is kept only once the broker acknowledged it."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import wait_until

from edgeinfer.bridge.serve.delivery import Delivery
from edgeinfer.bridge.serve.journal import Answer, Inbound, Journal
from edgeinfer.bridge.serve.replies import Outgoing
from edgeinfer.bridge.wire import protocol as proto

NOW_MS = 1.7e12
TOPIC = "edgeinfer/dev/m/req"
REPLY = "edgeinfer/clients/c/reply"


def _inbound(request_id: str, *, expiry_s: int | None = None, mid: int = 0, **body: Any) -> Inbound:
    payload = json.dumps({"id": request_id, "prompt": "hi", **body}).encode()
    return Inbound(
        topic=TOPIC,
        payload=payload,
        response_topic=REPLY,
        correlation=request_id.encode(),
        content_type=None,
        user_properties=(("tenant", "a"),),
        message_expiry_s=expiry_s,
        received_ms=NOW_MS,
        mid=mid,
    )


def _decode(inbound: Inbound) -> proto.Request | proto.ErrorReply:
    return proto.decode_request(
        inbound.payload,
        model="m",
        response_topic=inbound.response_topic,
        correlation=inbound.correlation,
        max_payload_bytes=1 << 16,
        received_ms=inbound.received_ms,
    )


class Wire:
    """What a Delivery submits, sends and acknowledges; each publish gets the next mid."""

    def __init__(self) -> None:
        self.submitted: list[proto.Request | proto.ErrorReply] = []
        self.sent: list[tuple[int, Outgoing]] = []
        self.acked: list[int] = []

    def delivery(self, journal: Journal, *, now_ms: float = NOW_MS, **options: Any) -> Delivery:
        options = {"keep_s": 3600.0, "keep_answers": 100, **options}
        d = Delivery(
            journal,
            decode=_decode,
            submit=self.submitted.append,
            send=lambda out: d.sending(out, lambda: self._publish(out)),
            ack=lambda mid, qos: self.acked.append(mid),
            clock_ms=lambda: now_ms,
            **options,
        )
        return d

    def _publish(self, out: Outgoing) -> int:
        self.sent.append((len(self.sent) + 1, out))
        return len(self.sent)

    def replies(self) -> list[dict[str, Any]]:
        return [proto.decode_reply(out.payload, fmt=out.fmt) for _, out in self.sent]


def _accept(delivery: Delivery, inbound: Inbound) -> None:
    delivery.accept(inbound, _decode(inbound), 1)


def test_a_recorded_request_survives_reopening_with_its_properties(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    inbound = _inbound("r1", expiry_s=60)
    journal.record((REPLY, "m", "r1"), inbound)
    journal.close()  # the process dies here: nothing else was written

    again = Journal(path)
    assert again.lookup((REPLY, "m", "r1")) is True
    [pending] = again.restart()
    assert pending.key == (REPLY, "m", "r1") and pending.inbound == inbound and pending.starts == 0
    assert again.restart()[0].starts == 1  # a second start counts it again
    key = (REPLY, "m", "r1")
    again.answer([(key, Answer("json", b'{"ok": true}', (b"c0", b"", b"c2")))], now_ms=1)
    again.answer([(key, Answer("json", b"later"))], now_ms=2)  # the first answer stays
    again.close()
    answered = Journal(path).lookup((REPLY, "m", "r1"))
    assert answered == Answer("json", b'{"ok": true}', (b"c0", b"", b"c2"))
    assert Journal(path).restart() == []


def test_keys_are_the_json_text_earlier_journals_hold(tmp_path: Path) -> None:
    """A key is stored as ``json.dumps`` of its strings (the files earlier bridges wrote)."""
    path = tmp_path / "j.sqlite3"
    Journal(path).close()
    odd = ("edgeinfer/clients/é/reply", "m", 'r-"1"\\ \n\t\x00\x7f 中 😀 \ud800')
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO requests (key, topic, payload, properties, received_ms, answered_ms, "
            "fmt, final) VALUES (?, ?, ?, ?, 0, 1, 'json', ?)",
            (json.dumps(list(odd)), TOPIC, b"{}", "{}", b'{"ok": true}'),
        )
    journal = Journal(path)
    assert journal.lookup(odd) == Answer("json", b'{"ok": true}')
    journal.record((*odd[:2], "r2"), _inbound("r2"))
    [pending] = journal.restart()
    assert pending.key == (*odd[:2], "r2")


def test_pruning_bounds_the_answered_by_age_and_count_and_keeps_the_pending(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j.sqlite3", durable=False)
    for i in range(10):
        journal.record((REPLY, "m", f"a{i}"), _inbound(f"a{i}"))
        journal.answer([((REPLY, "m", f"a{i}"), Answer("json", b"{}"))], now_ms=float(i))
    journal.record((REPLY, "m", "open"), _inbound("open"))
    assert journal.prune(before_ms=2.0, keep=100) == 2  # answered at 0 and 1
    assert journal.prune(before_ms=0.0, keep=3) == 5  # the 3 latest answers stay
    assert journal.counts() == {"pending": 1, "answered": 3}
    assert journal.lookup((REPLY, "m", "a9")) is not None
    assert journal.lookup((REPLY, "m", "a6")) is None


def test_an_answer_is_kept_only_once_the_broker_acknowledged_it(tmp_path: Path) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    delivery = wire.delivery(Journal(path))
    delivery.start()
    _accept(delivery, _inbound("r1", mid=41))
    delivery.acknowledge(41, 1)  # sent by the journal's thread with the row: not twice
    wait_until(lambda: wire.acked == [41])  # acknowledged once the row is committed
    assert wire.submitted and Journal(path).lookup((REPLY, "m", "r1")) is True
    key = (REPLY, "m", "r1")
    delivery._send(Outgoing(REPLY, b'{"chunk": 0, "id": "r1"}', b"r1", "json", key, False))
    delivery._send(Outgoing(REPLY, b'{"ok": true, "id": "r1"}', b"r1", "json", key, True))
    delivery._send(Outgoing(REPLY, b"{}", None, "json", None, True))  # an undecodable's error
    assert Journal(path).lookup(key) is True  # handed to paho, not yet acknowledged
    final_mid = wire.sent[1][0]
    delivery.published(final_mid)
    delivery.stop()  # commits what was acknowledged
    answer = Journal(path).lookup(key)
    assert isinstance(answer, Answer)
    assert answer.final == b'{"ok": true, "id": "r1"}'
    assert answer.chunks == (b'{"chunk": 0, "id": "r1"}',)


def test_after_a_restart_a_duplicate_gets_the_journal_answer_and_never_runs(
    tmp_path: Path,
) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    journal = Journal(path)
    journal.record((REPLY, "m", "r1"), _inbound("r1"))
    final = b'{"v": 1, "id": "r1", "ok": true, "done": true}'
    chunk = b'{"id": "r1", "chunk": 0}'
    journal.answer([((REPLY, "m", "r1"), Answer("json", final, (chunk,)))], now_ms=NOW_MS)
    journal.close()

    delivery = wire.delivery(Journal(path))
    assert delivery.restart() == 0
    _accept(delivery, _inbound("r1"))  # redelivered, or re-sent: the same id
    assert wire.submitted == []  # never run
    assert wire.replies() == [
        {"id": "r1", "chunk": 0, "replay": True},
        {"v": 1, "id": "r1", "ok": True, "done": True, "replay": True},
    ]
    assert all(out.correlation == b"r1" and out.topic == REPLY for _, out in wire.sent)


def test_an_id_answered_with_an_error_runs_again(tmp_path: Path) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    journal = Journal(path)
    journal.record((REPLY, "m", "r1"), _inbound("r1"))
    busy = proto.encode(proto.error_reply("r1", proto.BUSY, "queue full"), fmt="json")
    journal.answer([((REPLY, "m", "r1"), Answer("json", busy))], now_ms=1)
    delivery = wire.delivery(journal)
    _accept(delivery, _inbound("r1"))  # the retry a busy reply asks for
    assert [getattr(r, "id", None) for r in wire.submitted] == ["r1"] and not wire.sent
    assert journal.lookup((REPLY, "m", "r1")) is True


def test_a_start_re_runs_the_unanswered_and_refuses_the_expired_and_the_crash_loops(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.sqlite3"
    Journal(path).record((REPLY, "m", "poison"), _inbound("poison"))
    for _ in range(3):  # three starts, each killed before answering "poison"
        first = Wire()
        first.delivery(Journal(path), now_ms=NOW_MS + 1_000).restart()
        assert [getattr(r, "id", None) for r in first.submitted] == ["poison"]
    journal = Journal(path)
    journal.record((REPLY, "m", "again"), _inbound("again"))
    journal.record((REPLY, "m", "expired"), _inbound("expired", expiry_s=5))
    journal.close()

    wire = Wire()
    delivery = wire.delivery(Journal(path), now_ms=NOW_MS + 6_000)
    assert delivery.restart() == 3
    assert [r.id for r in wire.submitted if isinstance(r, proto.Request)] == ["again"]
    codes = {r["id"]: r["error"]["code"] for r in wire.replies()}
    assert codes == {"expired": proto.DEADLINE_EXCEEDED, "poison": proto.INTERNAL}
    assert delivery.snapshot()["expired"] == 1  # a counted drop: never run, never a late ok
    assert all(out.key is not None and out.final for _, out in wire.sent)  # marked when acked


def test_an_unwritable_journal_folder_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(Exception, match="journal_dir") as info:
        Journal(tmp_path / "file" / "j.sqlite3")
    assert info.type.__name__ == "ConfigError"


def test_after_a_restart_an_answered_id_asking_something_else_is_id_reused(
    tmp_path: Path,
) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    journal = Journal(path)
    key = (REPLY, "m", "r1")
    journal.record(key, _inbound("r1"))
    final = b'{"v": 1, "id": "r1", "ok": true, "done": true}'
    journal.answer([(key, Answer("json", final))], now_ms=NOW_MS)
    delivery = wire.delivery(journal)
    _accept(delivery, _inbound("r1", prompt="something else"))
    assert wire.submitted == []  # never run, and not given the first request's answer
    [reply] = wire.replies()
    assert reply["error"]["code"] == proto.ID_REUSED and "replay" not in reply


def _final(request_id: str) -> Outgoing:
    payload = json.dumps({"v": 1, "id": request_id, "ok": True}).encode()
    return Outgoing(REPLY, payload, request_id.encode(), "json", (REPLY, "m", request_id), True)


def test_rows_that_arrive_during_a_commit_share_the_next_one_and_nothing_leaves_before_it(
    tmp_path: Path,
) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    journal = Journal(path)
    commits: list[int] = []
    real_commit = journal.commit

    def counted(**batch: Any) -> None:
        real_commit(**batch)
        commits.append(len(batch["records"]))

    journal.commit = counted  # type: ignore[method-assign]
    delivery = wire.delivery(journal)
    delivery.start()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another writer holds the file: the commit must wait
    for i in range(3):
        _accept(delivery, _inbound(f"r{i}", mid=100 + i))
        delivery.acknowledge(100 + i, 1)
        delivery._send(_final(f"r{i}"))  # the worker answered before the row was committed
    assert [r.id for r in wire.submitted if isinstance(r, proto.Request)] == ["r0", "r1", "r2"]
    assert wire.acked == [] and wire.sent == []  # no PUBACK and no reply before the commit
    assert Journal(path).lookup((REPLY, "m", "r0")) is None
    assert not delivery.settle(timeout_s=0)  # what a stopping bridge waits for
    writer.execute("ROLLBACK")
    delivery.acknowledge(7, 1)  # a message that is not a request (a deploy chunk, say)
    assert delivery.settle(timeout_s=30)
    wait_until(lambda: len(wire.acked) == 4)
    assert wire.acked == [100, 101, 102, 7]  # in arrival order
    assert [json.loads(out.payload)["id"] for _, out in wire.sent] == ["r0", "r1", "r2"]
    again = Journal(path)
    assert all(again.lookup((REPLY, "m", f"r{i}")) is True for i in range(3))
    assert sum(commits) == 3 and len(commits) <= 2  # r0 alone (maybe), r1 and r2 together
    for mid, _ in wire.sent:
        delivery.published(mid)
    delivery.stop()
    assert all(isinstance(again.lookup((REPLY, "m", f"r{i}")), Answer) for i in range(3))


def test_a_crash_after_the_commit_and_before_the_puback_leaves_the_request_to_re_run(
    tmp_path: Path,
) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    stalled, release = threading.Event(), threading.Event()

    def ack(mid: int, qos: int) -> None:  # the bridge dies here: the PUBACK never leaves
        stalled.set()
        release.wait(30)

    delivery = Delivery(
        Journal(path),
        decode=_decode,
        submit=wire.submitted.append,
        send=lambda out: None,
        ack=ack,
        clock_ms=lambda: NOW_MS,
        keep_s=3600.0,
        keep_answers=100,
    )
    delivery.start()
    _accept(delivery, _inbound("r1", mid=7))
    delivery.acknowledge(7, 1)
    assert stalled.wait(30)
    restarted = Wire()  # the next start, on what the killed bridge left on disk
    assert restarted.delivery(Journal(path)).restart() == 1
    assert [r.id for r in restarted.submitted if isinstance(r, proto.Request)] == ["r1"]
    release.set()
    delivery.stop()


def test_a_row_that_cannot_be_written_is_still_answered_and_acknowledged(tmp_path: Path) -> None:
    path, wire = tmp_path / "j.sqlite3", Wire()
    journal = Journal(path)

    def broken(**batch: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    journal.commit = broken  # type: ignore[method-assign]
    delivery = wire.delivery(journal)
    delivery.start()
    _accept(delivery, _inbound("r1", mid=9))
    delivery.acknowledge(9, 1)
    delivery._send(_final("r1"))
    wait_until(lambda: wire.acked == [9])
    assert [json.loads(out.payload)["id"] for _, out in wire.sent] == ["r1"]
    assert delivery.snapshot()["in_flight"] == 0 and delivery.counts["recorded"] == 0
    delivery.stop()


def test_the_brokers_redelivery_of_a_known_request_is_dropped_a_clients_re_send_replayed(
    tmp_path: Path,
) -> None:
    """A bridge killed between a row's commit and its PUBACK gets the request again from the
    broker (DUP set) after the restart, which runs it from the journal anyway: one answer."""
    path, wire = tmp_path / "j.sqlite3", Wire()
    journal = Journal(path)
    journal.record((REPLY, "m", "open"), _inbound("open"))  # pending: re-run at the start
    journal.record((REPLY, "m", "done"), _inbound("done"))
    final = b'{"v": 1, "id": "done", "ok": true}'
    journal.answer([((REPLY, "m", "done"), Answer("json", final))], now_ms=NOW_MS)
    delivery = wire.delivery(journal)
    assert delivery.restart() == 1
    for rid in ("open", "done"):
        again = dataclasses.replace(_inbound(rid), redelivered=True)
        delivery.accept(again, _decode(again), 1)
    assert [r.id for r in wire.submitted if isinstance(r, proto.Request)] == ["open"]  # the start
    assert wire.sent == [] and delivery.counts["redelivery_dropped"] == 2
    _accept(delivery, _inbound("done"))  # the client re-sends: it may have missed the reply
    assert [r["id"] for r in wire.replies()] == ["done"] and wire.replies()[0]["replay"]
