"""The bridge's settings: topics, QoS, queue and payload bounds, caches, streams."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.bridge.connection import Connection
from edgeinfer.bridge.models import is_topic_level
from edgeinfer.bridge.wire.values import MAX_TOPIC_BYTES, valid_topic
from edgeinfer.config import ContinuousBatchConfig
from edgeinfer.errors import ConfigError

__all__ = ["BridgeConfig", "default_client_id", "default_state_dir"]

# A packet's bytes beyond its payload: fixed header, topic, ResponseTopic, CorrelationData and
# ContentType of a request fit with a wide margin (each is a few hundred bytes in practice).
_PACKET_HEADROOM = 64 * 1024


def default_client_id(device_id: str, shared_group: str | None = None) -> str:
    """A stable client id: the same bridge on the same host gets its persistent session back."""
    parts = ["edgeinfer", device_id]
    if shared_group:  # several bridges share the device id: the host tells them apart
        parts += [shared_group, socket.gethostname()]
    return "-".join(parts)[:128]


def default_state_dir() -> Path:
    """Where the bridge keeps its state (the request journal): ``$EDGEINFER_STATE_DIR``, else
    ``$XDG_STATE_HOME/edgeinfer``, else ``~/.local/state/edgeinfer``."""
    env = os.environ.get("EDGEINFER_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "edgeinfer"


@dataclass(frozen=True)
class BridgeConfig:
    """How the bridge serves.

    Args:
        connection: broker, credentials, TLS, protocol, client id and session settings.
        device_id: the device's topic level.
        topic_prefix: the first topic level.
        shared_group: subscribe through ``$share/GROUP/...`` so bridges in a group split requests;
            a member connects with ``Connection.group_member()`` (``session``): its session
            ends with its connection, so a dead member's share goes to the live ones.
        qos: QoS of the request subscription and of the replies; 1 (at least once, with the
            de-duplication store making it answer-once) is the default.
        max_queue: requests waiting at most; one more is answered ``busy`` at once.
        max_payload_bytes: bigger requests get ``payload_too_large`` unparsed; 256 KiB holds 64
            texts of a full 512-token window with room to spare.
        dedup_size: recent replies kept to answer repeated ids without running the model.
        worker_threads: threads running models (1: a request at a time, every core each).
        metrics_interval_s: seconds between metrics messages; 0 turns them off.
        reply_cache_bytes: answer a repeated deterministic request (same package and input)
            from memory without the worker hop; 0 (default) turns it off.
        max_generate_queue: generations waiting per generate model (beyond those running).
        max_generations: generations running at once per generate model, decoded together
            when the model was loaded with continuous batching (``edgeinfer serve`` loads
            generate packages so); ``None``: two per core, at most 8.
        max_client_requests: text, image and tensor requests one client (reply address) may
            have in flight, queued or running; one more is answered ``busy``. ``None``
            (default): no cap: the queue is already fair (round robin per reply address, and a
            full queue pushes out the newest request of the client holding the most), and a
            cap would turn a lone busy device away while the bridge sits idle.
        max_client_generations: the same per generate model, for generations; ``None``
            (default): no cap, for the same reason.
        max_streams: device streams of stateful models kept at once (least recent dropped).
        stream_idle_s: a stream without a request for this long starts afresh.
        reply_topics: topic filters a request's reply topic must match (a reply goes where the
            requester may read, never where only the bridge may write); default
            ``P/D/reply/#`` and ``P/clients/+/reply`` (``edgeinfer.bridge.Client``'s).
            Whatever they say, the bridge's own topics (status, deploy, metrics, errors) and
            request topics (``P/+/+/req``) are refused.
        availability: also keep a plain ``online``/``offline`` retained topic with its own
            Last Will, ``P/D/availability`` (Home Assistant, Node-RED; ``homeassistant.py``);
            in a shared group, the group's: ``online`` while any member serves.
        ha_discovery_prefix: publish Home Assistant MQTT discovery configs under this prefix
            (Home Assistant's default: ``homeassistant``) after every connect; ``None``: none.
        journal_dir: the folder of the request journal (one file per client id): a QoS 1
            request is acknowledged to the broker once it is recorded there, and its final
            reply kept, so a bridge killed mid-request answers it exactly once after a
            restart (``journal.py``). Default ``default_state_dir()``; ``None``: no journal
            (a request is acknowledged on receipt and duplicates are known in memory only).
        journal_keep_s: answered requests stay in the journal this long (duplicates within it
            are answered from there); at most ``dedup_size`` of them are kept. One hour: the
            broker session's expiry, past which nothing is redelivered.
    """

    connection: Connection
    device_id: str
    topic_prefix: str = "edgeinfer"
    shared_group: str | None = None
    qos: int = 1
    max_queue: int = 64
    max_payload_bytes: int = 256 * 1024
    dedup_size: int = 4096
    worker_threads: int = 1
    metrics_interval_s: float = 10.0
    reply_cache_bytes: int = 0
    max_generate_queue: int = 4
    max_generations: int | None = None
    max_client_requests: int | None = None
    max_client_generations: int | None = None
    max_streams: int = 256
    stream_idle_s: float = 300.0
    reply_topics: tuple[str, ...] = ()
    availability: bool = False
    ha_discovery_prefix: str | None = None
    journal_dir: Path | None = field(default_factory=default_state_dir)
    journal_keep_s: float = 3600.0

    @property
    def generations(self) -> int:
        """``max_generations``, or two per core (at most 8) when it is ``None``."""
        return ContinuousBatchConfig(max_sequences=self.max_generations).sequences

    def __post_init__(self) -> None:
        ContinuousBatchConfig(max_sequences=self.max_generations)  # its range check
        for name, level in (
            ("device_id", self.device_id),
            ("topic_prefix", self.topic_prefix),
            ("shared_group", self.shared_group or "x"),
        ):
            if not is_topic_level(level):
                raise ConfigError(f"{name} must be a non-empty topic level without / + # NUL")
        for name, cap in (
            ("max_client_requests", self.max_client_requests),
            ("max_client_generations", self.max_client_generations),
        ):
            if cap is not None and cap < 1:
                raise ConfigError(f"{name} must be >= 1, or None for no per-client cap")
        if self.qos not in (0, 1):
            raise ConfigError(f"qos must be 0 or 1, got {self.qos}")
        if self.max_payload_bytes < 64:
            raise ConfigError("max_payload_bytes must be >= 64")
        if self.journal_keep_s <= 0:
            raise ConfigError(f"journal_keep_s must be > 0, got {self.journal_keep_s}")
        if self.metrics_interval_s < 0 or self.stream_idle_s <= 0 or self.max_streams < 1:
            raise ConfigError("need metrics_interval_s >= 0, stream_idle_s > 0, max_streams >= 1")
        if self.ha_discovery_prefix is not None:
            if not valid_topic(self.ha_discovery_prefix) or self.ha_discovery_prefix[0] == "$":
                raise ConfigError("ha_discovery_prefix must be a topic name, e.g. homeassistant")
            if self.metrics_interval_s <= 0:
                raise ConfigError(
                    "Home Assistant discovery reads the metrics: metrics_interval_s must be > 0"
                )
        for topic in self.reply_topics:
            if not _valid_filter(topic):
                raise ConfigError(
                    f"reply topic filter {topic!r} is not a valid MQTT topic filter ('+' and '#' "
                    "only as whole levels, '#' last)"
                )

    def max_packet_bytes(self, *, other_bytes: int = 0) -> int:
        """The MQTT v5 Maximum Packet Size the bridge announces: the broker drops bigger
        messages rather than make paho read them whole. A request up to
        ``max_payload_bytes`` (or another message the bridge takes, up to ``other_bytes``:
        a deploy chunk) plus room for the topic, properties and a chunk's fields."""
        return max(self.max_payload_bytes, other_bytes) + _PACKET_HEADROOM

    @property
    def journal_path(self) -> Path | None:
        """This client id's journal file (``None`` without a journal, or at QoS 0)."""
        if self.journal_dir is None or self.qos == 0:
            return None
        client_id = self.connection.client_id
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", client_id)[:64]
        digest = hashlib.sha256(client_id.encode()).hexdigest()[:12]  # ids differing in '/' only
        return self.journal_dir / "bridge" / f"journal-{safe}-{digest}.sqlite3"

    @property
    def session(self) -> Connection:
        """The connection the bridge makes: ``connection``, or in a shared group its
        ``group_member()`` form (clean start, session expiry 0, a short keepalive)."""
        return self.connection.group_member() if self.shared_group else self.connection

    @property
    def base(self) -> str:
        """``PREFIX/DEVICE``."""
        return f"{self.topic_prefix}/{self.device_id}"

    def request_topic(self, model: str) -> str:
        """Where clients publish requests for ``model``."""
        return f"{self.base}/{model}/req"

    @property
    def subscription(self) -> str:
        """The bridge's one subscription (every model; unknown ones get ``unknown_model``)."""
        topic = f"{self.base}/+/req"
        return f"$share/{self.shared_group}/{topic}" if self.shared_group else topic

    @property
    def ota_control_topic(self) -> str:
        """Deploy control messages (begin, commit, rollback): not matched by ``P/D/+/req``,
        so a device allowed to send requests is not allowed to deploy."""
        return f"{self.base}/ota/ctl"

    @property
    def ota_chunk_topic(self) -> str:
        """Deploy chunks (their own topic: their own size limit)."""
        return f"{self.base}/ota/chunk"

    @property
    def ota_status_topic(self) -> str:
        """Retained: the outcome of the last deploy step taken."""
        return f"{self.base}/ota/status"

    @property
    def status_topic(self) -> str:
        """Retained online/offline; per client in a shared group (each bridge has its own)."""
        return self.member_status_topic(self.connection.client_id)

    def member_status_topic(self, client_id: str) -> str:
        """The status of the bridge ``client_id``: ``P/D/status/CLIENT_ID`` in a shared group,
        else ``P/D/status``."""
        return f"{self.base}/status/{client_id}" if self.shared_group else f"{self.base}/status"

    @property
    def metrics_topic(self) -> str:
        """Periodic JSON statistics; per client in a shared group (two bridges' numbers)."""
        return self.member_metrics_topic(self.connection.client_id)

    def member_metrics_topic(self, client_id: str) -> str:
        """``P/D/metrics/CLIENT_ID`` in a shared group, else ``P/D/metrics``."""
        return f"{self.base}/metrics/{client_id}" if self.shared_group else f"{self.base}/metrics"

    @property
    def availability_topic(self) -> str:
        """The plain ``online``/``offline`` topic: the device's, one for a whole shared group
        (``online`` while any member serves; ``homeassistant.py``)."""
        return f"{self.base}/availability"

    @property
    def reply_filters(self) -> tuple[str, ...]:
        """The topic filters replies may go to (``reply_topics``, or the defaults)."""
        prefix = self.topic_prefix
        return self.reply_topics or (f"{self.base}/reply/#", f"{prefix}/clients/+/reply")

    def reply_refusal(self, topic: str) -> str | None:
        """Why the bridge will not publish a reply to ``topic``, or ``None`` when it may."""
        if not valid_topic(topic):
            return "the reply topic is not a valid MQTT topic name"
        owned, allowed = self._reply_patterns
        if topic.startswith("$") or owned.fullmatch(topic):
            return f"the reply topic {topic!r} is one of the bridge's own or a request topic"
        if not allowed.fullmatch(topic):
            return (
                f"the reply topic {topic!r} matches none of {list(self.reply_filters)}: reply "
                "there, or add a filter with `edgeinfer serve --reply-topic`"
            )
        return None

    @functools.cached_property
    def _reply_patterns(self) -> tuple[re.Pattern[str], re.Pattern[str]]:
        """(the bridge's own and request topics, the reply filters) as compiled patterns: one
        match per request instead of a filter walk per filter (~0.08 ms)."""
        owned = (f"{self.topic_prefix}/+/+/req", f"{self.base}/+/req/#", *self._own_topics)
        return _filters_pattern(owned), _filters_pattern(self.reply_filters)

    @property
    def _own_topics(self) -> tuple[str, ...]:
        base = self.base
        return (
            f"{base}/status/#",
            f"{base}/availability/#",
            f"{base}/deploy/#",
            f"{base}/ota/#",
            f"{base}/metrics/#",
            f"{base}/errors/#",
        )


def _filters_pattern(filters: tuple[str, ...]) -> re.Pattern[str]:
    """A pattern whose ``fullmatch`` is MQTT's filter match of any of ``filters`` (``+``: one
    level, ``#``: this level and all below it, the parent included)."""
    alternatives = []
    for topic_filter in filters:
        levels = topic_filter.split("/")
        tail = ""
        if levels[-1] == "#":
            levels.pop()
            tail = "(?:/.*)?" if levels else ".*"
        parts = ["[^/]*" if level == "+" else re.escape(level) for level in levels]
        alternatives.append("/".join(parts) + tail)
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.DOTALL)


def _valid_filter(topic: str) -> bool:
    levels = topic.split("/")
    if not topic or "\0" in topic or len(topic.encode("utf-8", "replace")) > MAX_TOPIC_BYTES:
        return False
    for i, level in enumerate(levels):
        if ("+" in level and level != "+") or (
            "#" in level and (level != "#" or i < len(levels) - 1)
        ):
            return False
    return True
