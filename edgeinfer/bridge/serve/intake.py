"""What the bridge makes of a message on a request topic before the journal and the worker see
it: the decoded request (or the error to answer), the refusal of a retained request, the reply
to a message that broke its handler, and the request subscription's options."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeinfer.bridge.serve.journal import Inbound
from edgeinfer.bridge.serve.settings import BridgeConfig
from edgeinfer.bridge.wire import protocol as proto

__all__ = ["decode", "request_options", "retained_refusal", "unhandled_reply"]

RETAINED = (
    "the request was published retained, so it would run again for every bridge that "
    "subscribes; it was not run and has been cleared: publish requests with retain off"
)


def decode(inbound: Inbound, config: BridgeConfig) -> proto.Request | proto.ErrorReply:
    """Decode a request message (the model is its topic's next-to-last level).

    A v5 Message Expiry Interval bounds the request's deadline: the broker counts down the time
    a message waited for the bridge, so what is left on arrival is what the sender still waits
    (``edgeinfer.bridge.Client`` sends its timeout there); the earlier of it and the payload's
    ``timeout_ms``/``deadline_ms`` is the deadline the worker drops an unstarted request at.
    """
    levels = inbound.topic.split("/")
    decoded = proto.decode_request(
        inbound.payload,
        model=levels[-2] if len(levels) >= 2 else "",
        content_type=inbound.content_type,
        response_topic=inbound.response_topic,
        correlation=inbound.correlation,
        max_payload_bytes=config.max_payload_bytes,
        received_ms=inbound.received_ms,
        reply_refusal=config.reply_refusal,
    )
    expires_ms = inbound.expires_ms
    if not isinstance(decoded, proto.Request) or expires_ms is None:
        return decoded
    if decoded.deadline_ms is not None and decoded.deadline_ms <= expires_ms:
        return decoded
    return replace(decoded, deadline_ms=expires_ms)


def retained_refusal(inbound: Inbound, config: BridgeConfig) -> proto.ErrorReply:
    """The ``bad_request`` answer to a retained request (to its reply topic where allowed)."""
    decoded = decode(inbound, config)
    return proto.ErrorReply(
        proto.BAD_REQUEST,
        RETAINED,
        id=getattr(decoded, "id", None),
        model=getattr(decoded, "model", None),
        reply_to=decoded.reply_to,
        correlation=decoded.correlation,
        fmt=decoded.fmt,
    )


def unhandled_reply(message: Any, config: BridgeConfig) -> proto.ErrorReply:
    """An ``internal`` error reply to a message that broke its handler, where it asked for one
    at an allowed topic (the errors topic otherwise)."""
    props = getattr(message, "properties", None)
    topic = getattr(props, "ResponseTopic", None) or None
    correlation = getattr(props, "CorrelationData", None)
    allowed = isinstance(topic, str) and config.reply_refusal(topic) is None
    return proto.ErrorReply(
        proto.INTERNAL,
        "the bridge could not handle this message and dropped it; see its log",
        reply_to=topic if allowed else None,
        correlation=None if correlation is None else bytes(correlation),
        fmt=proto.wire_format(getattr(props, "ContentType", None)),
    )


def request_options(config: BridgeConfig) -> Any:
    """The request subscription's QoS; on v5 also Retain As Published, so that a retained
    request published while the bridge is subscribed is seen as retained (and refused)."""
    if not config.connection.is_v5:
        return config.qos
    from paho.mqtt.subscribeoptions import SubscribeOptions

    return SubscribeOptions(qos=config.qos, retainAsPublished=True)
