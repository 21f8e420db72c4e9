"""How the bridge and its client reach a broker: URL, auth, TLS, protocol, session.

Both sides build their paho client here, so both get the same choices: paho-mqtt 2.x with
``CallbackAPIVersion.VERSION2``, MQTT v5 by default (3.1.1 supported), a persistent session (clean
start off, a session expiry) so QoS 1 messages survive a disconnect, and TCP_NODELAY on the socket
(without it a QoS 1 round trip on loopback waits on Nagle's algorithm: tens of ms instead of ~1).

A member of a shared-subscription group is the exception (``Connection.group_member``): a
session the broker kept for a dead member would keep receiving that member's round-robin share
(MQTT v5 §4.8.2 lets the broker queue it there for the whole session expiry), so a member
starts clean and its session ends with its connection; what it had accepted is in its journal.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from edgeinfer.errors import (
    BridgeError,
    BrokerAuthError,
    BrokerUnavailableError,
    ConfigError,
    MissingDependencyError,
)

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = [
    "GROUP_KEEPALIVE_S",
    "PROTOCOLS",
    "Connection",
    "Handshake",
    "connect_async",
    "new_paho_client",
    "parse_broker_url",
]

_SCHEMES = {"mqtt": (1883, False), "tcp": (1883, False), "mqtts": (8883, True), "ssl": (8883, True)}
PROTOCOLS = ("5", "3.1.1")
# A group member's keepalive at most: a member cut off without a TCP close (power, network) is
# noticed within 15 s, and its share goes to the others; one PINGREQ per 10 s costs nothing.
GROUP_KEEPALIVE_S = 10


def parse_broker_url(url: str) -> tuple[str, int, bool]:
    """``mqtt://HOST[:PORT]`` or ``mqtts://HOST[:PORT]`` -> (host, port, tls)."""
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ConfigError(f"broker must be mqtt://HOST:PORT or mqtts://HOST:PORT, got {url!r}")
    if parts.username is not None or parts.password is not None:  # URLs end up in logs
        raise ConfigError(
            "put credentials in --username and --password-file (or the environment), not in "
            "the broker URL"
        )
    default_port, tls = _SCHEMES[parts.scheme]
    try:
        port = parts.port or default_port
    except ValueError as exc:
        raise ConfigError(f"bad port in broker URL {url!r}") from exc
    return parts.hostname, port, tls


@dataclass(frozen=True)
class Connection:
    """Where and how to connect.

    Args:
        broker: ``mqtt://HOST:PORT`` (plain) or ``mqtts://HOST:PORT`` (TLS).
        client_id: the MQTT client id; it names the persistent session, so keep it stable.
        protocol: ``"5"`` (default) or ``"3.1.1"``.
        username, password: broker credentials (the password never appears in repr or logs).
        tls_ca: CA file to verify the broker with (default: the system's CAs).
        tls_cert, tls_key: a client certificate, when the broker asks for one.
        session_expiry_s: how long the broker keeps the session (and queued QoS 1 messages)
            after a disconnect; one hour covers a device reboot or a broker restart.
        keepalive_s: MQTT keepalive; 30 s notices a dead link within ~45 s.
        clean_start: start with a fresh session, discarding one the broker kept (MQTT v5 Clean
            Start, 3.1.1 clean session); off: a reconnect gets its queued messages back.
        reconnect_min_s, reconnect_max_s: reconnect backoff bounds (doubling in between).
    """

    broker: str = "mqtt://127.0.0.1:1883"
    client_id: str = ""
    protocol: str = "5"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    session_expiry_s: int = 3600
    keepalive_s: int = 30
    clean_start: bool = False
    reconnect_min_s: int = 1
    reconnect_max_s: int = 30

    def __post_init__(self) -> None:
        parse_broker_url(self.broker)
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if not self.client_id or len(self.client_id) > 128:
            raise ConfigError("client_id must be 1..128 characters")
        if self.password is not None and self.username is None:
            raise ConfigError("a password needs a username")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("give both tls_cert and tls_key, or neither")
        if self.session_expiry_s < 0 or self.keepalive_s < 1:
            raise ConfigError("session_expiry_s must be >= 0 and keepalive_s >= 1")
        if not 1 <= self.reconnect_min_s <= self.reconnect_max_s:
            raise ConfigError("need 1 <= reconnect_min_s <= reconnect_max_s")

    @property
    def is_v5(self) -> bool:
        """Whether this connection speaks MQTT v5."""
        return self.protocol == "5"

    def group_member(self) -> Connection:
        """This connection as a shared-group member uses it: a clean start and a session that
        ends with the connection (expiry 0), so a member that dies stops receiving its share
        as soon as the broker sees the link gone (at once for a killed process: its socket
        closes; within 1.5 keepalives for a power cut, hence at most ``GROUP_KEEPALIVE_S``)."""
        return replace(
            self,
            session_expiry_s=0,
            clean_start=True,
            keepalive_s=min(self.keepalive_s, GROUP_KEEPALIVE_S),
        )


def _nodelay(client: Any, userdata: Any, sock: Any) -> None:
    """paho's on_socket_open: disable Nagle's algorithm on the broker socket."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # a websocket wrapper or a non-TCP socket: nothing to do
        pass


def new_paho_client(conn: Connection) -> PahoClient:
    """A configured, not yet connected paho client (auth, TLS, nodelay, backoff)."""
    try:
        from paho.mqtt import client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
    except ImportError as exc:
        raise MissingDependencyError("paho-mqtt", "mqtt") from exc
    _, _, tls = parse_broker_url(conn.broker)
    if conn.is_v5:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=conn.client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
        )
    else:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=conn.client_id,
            protocol=MQTTProtocolVersion.MQTTv311,
            clean_session=conn.clean_start,
        )
    if conn.username is not None:
        client.username_pw_set(conn.username, conn.password)
    if tls or conn.tls_ca is not None:
        try:
            client.tls_set(
                ca_certs=str(conn.tls_ca) if conn.tls_ca else None,
                certfile=str(conn.tls_cert) if conn.tls_cert else None,
                keyfile=str(conn.tls_key) if conn.tls_key else None,
            )
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot set up TLS: {exc}") from exc
    client.on_socket_open = _nodelay
    client.reconnect_delay_set(conn.reconnect_min_s, conn.reconnect_max_s)
    return client


def connect_async(
    client: PahoClient, conn: Connection, *, max_packet_bytes: int | None = None
) -> None:
    """Start connecting in the background (paho's loop retries until the broker answers).

    ``max_packet_bytes`` (MQTT v5) asks the broker never to send a larger packet: it drops
    such a message instead, so it never reaches this process's memory (paho reads a whole
    packet before any callback could look at its size).
    """
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    host, port, _ = parse_broker_url(conn.broker)
    if conn.is_v5:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = conn.session_expiry_s
        if max_packet_bytes is not None:
            props.MaximumPacketSize = max_packet_bytes
        client.connect_async(
            host, port, keepalive=conn.keepalive_s, clean_start=conn.clean_start, properties=props
        )
    else:
        client.connect_async(host, port, keepalive=conn.keepalive_s)


class Handshake:
    """A client's first connect and subscribe, as paho's callbacks report them.

    paho retries a refused login in the background until it is stopped, so a wrong or
    missing password would otherwise look like a broker that never answers. ``wait`` tells
    them apart: a refused connection or subscription is a ``BrokerAuthError`` as soon as the
    broker says so, no answer at all a ``BrokerUnavailableError`` after the timeout.
    """

    def __init__(self, conn: Connection) -> None:
        self.broker = conn.broker
        self.refused: str | None = None
        self._done = threading.Event()

    def connected(self, reason: ReasonCode) -> bool:
        """From ``on_connect``: record a refusal; whether the client may go on and subscribe."""
        if reason.is_failure:
            self.refused = f"the connection: {reason}"
            self._done.set()
        return not reason.is_failure

    def subscribed(self, reasons: list[ReasonCode]) -> None:
        """From ``on_subscribe``: the handshake is over (refused if any topic was)."""
        failed = [str(r) for r in reasons if r.is_failure]
        if failed:
            self.refused = f"the subscription: {', '.join(failed)}"
        self._done.set()

    def wait(self, *, timeout_s: float) -> None:
        """Return once subscribed.

        Raises:
            BrokerAuthError: the broker refused the login or the subscription.
            BrokerUnavailableError: no answer within ``timeout_s`` (down, unreachable, TLS).
        """
        if not self._done.wait(timeout_s):
            raise BrokerUnavailableError(f"not connected to {self.broker} in {timeout_s} s")
        if self.refused is not None:
            raise BrokerAuthError(
                f"the broker at {self.broker} refused {self.refused}; check the user name "
                "and password"
            )


def subscriber(
    conn: Connection,
    topics: list[tuple[str, int]],
    on_message: Callable[[Any, Any, Any], None],
    *,
    timeout_s: float,
    max_inflight: int | None = None,
) -> PahoClient:
    """A started paho client subscribed to ``topics`` (again after every reconnect) that
    hands each message to ``on_message`` (``max_inflight``: QoS 1 publishes in flight, set
    before connecting as paho requires); returns once subscribed (``Handshake.wait``'s
    errors, the client stopped)."""
    handshake = Handshake(conn)
    client = new_paho_client(conn)
    if max_inflight is not None:
        client.max_inflight_messages_set(max_inflight)

    def on_connect(c: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if handshake.connected(reason):
            c.subscribe(topics)

    client.on_connect = on_connect
    client.on_subscribe = lambda c, u, mid, reasons, p: handshake.subscribed(reasons)
    client.on_message = on_message
    connect_async(client, conn)
    client.loop_start()
    try:
        handshake.wait(timeout_s=timeout_s)
    except BridgeError:
        client.disconnect()
        client.loop_stop()
        raise
    return client
