"""The wire protocol alone (no broker, no paho): decode never raises, and says why it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeinfer.bridge.connection import Connection, parse_broker_url
from edgeinfer.bridge.wire import kinds
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.bridge.wire.arrays import vectors_json
from edgeinfer.bridge.wire.kinds import MAX_TEXTS, TextInput
from edgeinfer.errors import ConfigError

LIMIT = 4096


def decode(payload: bytes, **kw: object) -> proto.Request | proto.ErrorReply:
    args: dict[str, object] = {
        "model": "m",
        "response_topic": "r/t",
        "correlation": b"c",
        "max_payload_bytes": LIMIT,
        "received_ms": 1000.0,
    }
    args.update(kw)
    return proto.decode_request(payload, **args)  # type: ignore[arg-type]


def test_a_valid_request_decodes_with_its_deadline() -> None:
    req = decode(
        json.dumps(
            {"id": "a", "texts": ["x", "y"], "timeout_ms": 50, "params": {"truncate": False}}
        ).encode()
    )
    assert isinstance(req, proto.Request)
    assert req.kind == "text" and req.input == TextInput(("x", "y"), truncate=False)
    assert (req.id, req.deadline_ms) == ("a", 1050.0)
    assert (req.reply_to, req.correlation, req.fmt) == ("r/t", b"c", "json")


def test_v311_reply_to_comes_from_the_payload() -> None:
    req = decode(
        b'{"id": "a", "text": "x", "reply_to": "me/reply"}', response_topic=None, correlation=None
    )
    assert isinstance(req, proto.Request) and req.reply_to == "me/reply"
    no_topic = decode(b'{"id": "a", "text": "x"}', response_topic=None)
    assert isinstance(no_topic, proto.ErrorReply) and no_topic.code == proto.BAD_REQUEST


@pytest.mark.parametrize(
    "body, why",
    [
        ({"text": "x"}, "'id'"),
        ({"id": "", "text": "x"}, "'id'"),
        ({"id": "a" * (proto.MAX_ID_CHARS + 1), "text": "x"}, "'id'"),
        ({"id": "a"}, "which kind"),
        ({"id": "a", "text": "x", "texts": ["y"]}, "exactly one"),
        ({"id": "a", "text": "x", "prompt": "y"}, "which kind"),
        ({"id": "a", "v": 2, "text": "x"}, "newer than this bridge"),
        ({"id": "a", "text": "x", "encoding": "hex"}, "'encoding'"),
        ({"id": "a", "texts": []}, "non-empty list"),
        ({"id": "a", "texts": "x"}, "non-empty list"),
        ({"id": "a", "texts": ["x", 3]}, "non-empty string"),
        ({"id": "a", "text": "   "}, "non-empty string"),
        ({"id": "a", "texts": ["x"] * (MAX_TEXTS + 1)}, "at most"),
        ({"id": "a", "text": "x", "timeout_ms": 0}, "positive"),
        ({"id": "a", "text": "x", "timeout_ms": True}, "positive"),
        ({"id": "a", "text": "x", "deadline_ms": "soon"}, "epoch ms"),
        ({"id": "a", "text": "x", "deadline_ms": 1, "timeout_ms": 1}, "at most one"),
        ({"id": "a", "text": "x", "params": {"temperature": 1}}, "'params'"),
        ({"id": "a", "text": "x", "params": {"truncate": "yes"}}, "truncate"),
    ],
)
def test_wrong_fields_are_bad_requests_that_keep_the_id(body: dict[str, object], why: str) -> None:
    reply = decode(json.dumps(body).encode())
    assert isinstance(reply, proto.ErrorReply)
    assert reply.code == proto.BAD_REQUEST and why in reply.message
    assert reply.reply_to == "r/t" and reply.correlation == b"c"
    if body.get("id") == "a":
        assert reply.id == "a"


def test_oversize_is_refused_before_parsing() -> None:
    reply = decode(b"{" + b" " * LIMIT + b"}")
    assert isinstance(reply, proto.ErrorReply) and reply.code == proto.PAYLOAD_TOO_LARGE


def test_msgpack_round_trip_when_the_content_type_says_so() -> None:
    pytest.importorskip("msgpack")
    payload = proto.encode({"id": "a", "text": "x"}, fmt="msgpack")
    req = decode(payload, content_type="application/msgpack")
    assert isinstance(req, proto.Request) and req.fmt == "msgpack"
    assert decode(payload) == decode(payload, content_type="text/plain")  # JSON: not valid
    reply = proto.encode(proto.error_reply("a", proto.BUSY, "full"), fmt="msgpack")
    assert proto.decode_reply(reply, fmt="msgpack")["error"]["code"] == proto.BUSY


@settings(max_examples=500, deadline=None, database=None)
@given(
    payload=st.binary(max_size=LIMIT + 64),
    content_type=st.sampled_from([None, "application/json", "application/msgpack"]),
)
def test_any_bytes_decode_to_a_request_or_an_error_reply(
    payload: bytes, content_type: str | None
) -> None:
    result = decode(payload, content_type=content_type)
    assert isinstance(result, proto.Request | proto.ErrorReply)
    if isinstance(result, proto.ErrorReply):
        assert result.code in proto.ERROR_CODES
        json.loads(proto.encode(result.to_dict()))  # every error reply is encodable


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None, database=None)
@given(
    body=st.dictionaries(
        st.sampled_from(
            ["id", "text", "texts", "params", "timeout_ms", "deadline_ms", "reply_to", "other"]
        ),
        json_values,
    )
)
def test_wrong_typed_objects_never_raise(body: dict[str, object]) -> None:
    result = decode(json.dumps(body).encode())
    if isinstance(result, proto.Request):  # then it really was valid
        assert isinstance(body["id"], str) and isinstance(result.input, TextInput)
        assert all(isinstance(t, str) for t in result.input.texts)


def test_broker_urls_and_connection_checks() -> None:
    assert parse_broker_url("mqtt://127.0.0.1:1884") == ("127.0.0.1", 1884, False)
    assert parse_broker_url("mqtts://127.0.0.1") == ("127.0.0.1", 8883, True)
    for bad in (
        "http://127.0.0.1",
        "127.0.0.1:1883",
        "mqtt://127.0.0.1:notaport",
        "mqtt://user:secret@127.0.0.1:1883",
    ):
        with pytest.raises(ConfigError):
            parse_broker_url(bad)
    with pytest.raises(ConfigError):
        Connection(client_id="x", protocol="4")
    with pytest.raises(ConfigError):
        Connection(client_id="x", password="p")
    assert "p4ss" not in repr(Connection(client_id="x", username="u", password="p4ss"))


def test_reply_topics_are_limited_to_the_reply_filters() -> None:
    from edgeinfer.bridge import BridgeConfig

    default = BridgeConfig(connection=Connection(client_id="b"), device_id="d")
    allowed = ["edgeinfer/d/reply/valve-7", "edgeinfer/clients/valve-7/reply"]
    refused = [
        "edgeinfer/d/status",  # the bridge's own topics
        "edgeinfer/d/deploy/req",
        "edgeinfer/d/metrics",
        "edgeinfer/d/errors",
        "edgeinfer/d2/minilm/req",  # another device's requests
        "edgeinfer/d/minilm/req",
        "$SYS/broker/x",
        "factory/valve-7",  # outside the filters
        "edgeinfer/d/reply/+",  # not a topic name
        "",
    ]
    assert [default.reply_refusal(t) for t in allowed] == [None, None]
    assert all(default.reply_refusal(t) for t in refused)
    custom = BridgeConfig(
        connection=Connection(client_id="b"), device_id="d", reply_topics=("plant/+/answers", "#")
    )
    assert custom.reply_refusal("plant/line-3/answers") is None
    assert custom.reply_refusal("anything/else") is None  # '#' allows any topic ...
    assert custom.reply_refusal("edgeinfer/d/status") is not None  # ... but the bridge's own
    assert custom.reply_refusal("edgeinfer/d9/m/req") is not None  # and request topics
    for bad in ("a/#/b", "a/b+", ""):
        with pytest.raises(ConfigError, match="topic filter"):
            BridgeConfig(connection=Connection(client_id="b"), device_id="d", reply_topics=(bad,))


def test_reply_filter_patterns_match_as_mqtt_does() -> None:
    """The compiled reply filters agree with paho's own filter match on random filters/topics."""
    import random

    from paho.mqtt.client import topic_matches_sub

    from edgeinfer.bridge.serve.settings import _filters_pattern

    rng = random.Random(0)
    for _ in range(5000):
        levels = [rng.choice(["a", "b", "+", "x"]) for _ in range(rng.randint(1, 4))]
        topic_filter = "/".join(levels + (["#"] if rng.random() < 0.4 else []))
        topic = "/".join(rng.choice(["a", "b", "x", ""]) for _ in range(rng.randint(1, 5)))
        mine = _filters_pattern((topic_filter,)).fullmatch(topic) is not None
        assert mine == topic_matches_sub(topic_filter, topic), (topic_filter, topic)


@pytest.mark.parametrize(
    ("payload", "raw_id", "code"),
    [
        (b'{"id": 17, "text": "x", "reply_to": "r"}', "17", "bad_request"),
        (json.dumps({"id": "y" * 300, "text": "x"}).encode(), "y" * 200, "bad_request"),
        (b'{"id": "cut-1", "text": ', "cut-1", "bad_request"),
        (b'{"id": "esc\\"aped", "text": ', 'esc"aped', "bad_request"),
        (b'{"id": "big-1", "text": "' + b"z" * 5000 + b'"}', "big-1", "payload_too_large"),
        (b"\xff\xfe not json at all", None, "bad_request"),
    ],
)
def test_an_unusable_id_comes_back_as_raw_id(payload: bytes, raw_id: str | None, code: str) -> None:
    """What a 3.1.1 client (no CorrelationData) can match an error reply by."""
    reply = proto.decode_request(payload, model="m", max_payload_bytes=4096, received_ms=0.0)
    assert isinstance(reply, proto.ErrorReply) and reply.code == code
    body = reply.to_dict()
    assert body["id"] is None and body.get("raw_id") == raw_id


def test_generate_stream_and_chat_flags() -> None:
    """``"stream": false`` asks for the final only; ``"chat": true`` makes the prompt one user
    message; both must be booleans."""
    base = {"id": "g", "prompt": "Is valve 7 open?", "reply_to": "r"}
    quiet = proto.decode_request(
        json.dumps({**base, "stream": False, "chat": True}).encode(),
        model="m",
        max_payload_bytes=4096,
        received_ms=0.0,
    )
    assert isinstance(quiet, proto.Request) and isinstance(quiet.input, kinds.GenerateInput)
    assert quiet.input.stream is False
    assert quiet.input.prompt == ({"role": "user", "content": "Is valve 7 open?"},)
    for bad in ({"stream": "no"}, {"chat": 1}):
        refused = proto.decode_request(
            json.dumps({**base, **bad}).encode(), model="m", max_payload_bytes=4096, received_ms=0.0
        )
        assert isinstance(refused, proto.ErrorReply) and refused.code == "bad_request"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=40),
        max_size=3,
    )
)
def test_shortest_vectors_are_each_float32s_shortest_form(rows: list[list[float]]) -> None:
    arrays_in = [np.asarray(row, np.float32) for row in rows]
    text = vectors_json(arrays_in, encoding="shortest")
    parsed = json.loads(text)
    for row, back in zip(arrays_in, parsed, strict=True):
        np.testing.assert_array_equal(np.asarray(back, np.float32), row)  # the same float32s
    expected = ",".join("[" + ",".join(str(v) for v in row) + "]" for row in arrays_in)
    assert text.decode() == f"[{expected}]"  # numpy's shortest repr, uncut
