"""The MQTT side of the bridge: subscribe, decode, hand to the worker, publish replies.

paho's network thread runs ``_on_message``: decode, queue a QoS 1 request's journal row
(``delivery.py``: the PUBACK waits for its commit), ``Worker.submit`` (cheap); models run on
the worker's threads. A retained request is refused and cleared.
Subscriptions are made in ``_on_connect`` so that they come back after every reconnect; the
retained status topic says ``online`` with each served model's package digest and signer, and
the Last Will makes it ``offline`` when the bridge vanishes.
Topics (``P``: topic prefix, ``D``: device id)::

    P/D/MODEL/req      requests (via $share/GROUP/P/D/+/req when scaled out)
    P/D/status         retained JSON {"state": online|offline, "models": {...}}
                       (P/D/status/CLIENT_ID in a shared group)
    P/D/availability   retained plain online|offline, with its own Will (homeassistant.py;
                       the group's in a shared group: online while any member serves)
    P/D/ota/ctl        deploy control messages (deploy.py), with a deploy folder and keys
    P/D/ota/chunk      deploy chunks (each topic has its own size limit)
    P/D/ota/status     retained JSON: the last deploy step's outcome
    P/D/metrics        periodic JSON statistics (P/D/metrics/CLIENT_ID in a shared group)
    P/D/errors         error replies for requests that named no reply topic
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.bridge.connection import connect_async, new_paho_client
from edgeinfer.bridge.models import ModelTable, ServedModel, is_topic_level
from edgeinfer.bridge.ota.deploy import Deployer
from edgeinfer.bridge.ota.deploy_config import DeployConfig
from edgeinfer.bridge.serve import intake, presence
from edgeinfer.bridge.serve.delivery import Delivery
from edgeinfer.bridge.serve.homeassistant import AvailabilityLink, Discovery
from edgeinfer.bridge.serve.journal import Inbound, Journal
from edgeinfer.bridge.serve.outbox import Outbox
from edgeinfer.bridge.serve.serving import StreamTable
from edgeinfer.bridge.serve.settings import BridgeConfig, default_client_id
from edgeinfer.bridge.serve.worker import Outgoing, Worker, epoch_ms
from edgeinfer.errors import BrokerAuthError, BrokerUnavailableError, ConfigError

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient
    from paho.mqtt.client import ConnectFlags, DisconnectFlags, MQTTMessage
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["Bridge", "BridgeConfig", "default_client_id"]

log = logging.getLogger(__name__)


@dataclass
class _State:
    connected: threading.Event = field(default_factory=threading.Event)
    subscribed: threading.Event = field(default_factory=threading.Event)
    refused: str | None = None
    connects: int = 0


class Bridge:
    """Serve models over MQTT. Use as a context manager, or ``start()`` then ``stop()``.

    Args:
        models: model name (its topic level) -> a loaded model.
        config: the bridge settings.
        deploy: take signed packages over MQTT (``edgeinfer.bridge.DeployConfig``); ``None``:
            no deploys.
        origins: the package folder each model was loaded from (``rollback`` goes back to it
            after a first deploy; its signature, when trusted, names the signer in the status).
        clock_ms: epoch-ms clock of the deadlines (tests pass a fake one).
    """

    def __init__(
        self,
        models: Mapping[str, ServedModel],
        *,
        config: BridgeConfig,
        deploy: DeployConfig | None = None,
        origins: Mapping[str, Path] | None = None,
        clock_ms: Callable[[], float] = epoch_ms,
    ) -> None:
        if not models:
            raise ConfigError("the bridge needs at least one model")
        for name in models:
            if not is_topic_level(name):
                raise ConfigError(f"model name {name!r} is not a valid topic level")
        if deploy is not None and config.shared_group:
            raise ConfigError("deploys go to one bridge: not with a shared group")
        self.config = config
        self._state = _State()
        self._stop = threading.Event()
        self._clock = clock_ms
        self.models = ModelTable(models)
        self.worker = Worker(
            self.models,
            send=self._send,
            max_queue=config.max_queue,
            dedup_size=config.dedup_size,
            threads=config.worker_threads,
            clock_ms=clock_ms,
            reply_cache_bytes=config.reply_cache_bytes,
            max_generate_queue=config.max_generate_queue,
            max_generations=config.generations,
            streams=StreamTable(max_streams=config.max_streams, idle_s=config.stream_idle_s),
        )
        journal = None if config.journal_path is None else Journal(config.journal_path)
        self.delivery = Delivery(
            journal,
            decode=partial(intake.decode, config=config),
            submit=self.worker.submit,
            send=self._send,
            ack=lambda mid, qos: self._client.ack(mid, qos),
            clock_ms=clock_ms,
            keep_s=config.journal_keep_s,
            keep_answers=config.dedup_size,
        )
        self.deployer = (
            None
            if deploy is None
            else Deployer(
                deploy,
                device_id=config.device_id,
                models=self.models,
                origins=origins or {},
                publish=self._publish_deploy_status,
                on_swap=self._publish_status,
            )
        )
        self._client: PahoClient = new_paho_client(config.session)
        self._outbox = Outbox(self._client, config, self.delivery)
        offline = presence.offline(config.connection.client_id, self.deployer)
        self._client.will_set(config.status_topic, offline, qos=1, retain=True)
        self._client.max_inflight_messages_set(max(20, config.max_queue))
        self._client.manual_ack_set(True)  # _on_message acknowledges, once a request is recorded
        self._client.on_publish = self._on_publish
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message
        self._availability = AvailabilityLink(config) if config.availability else None
        self._discovery = (
            None
            if config.ha_discovery_prefix is None
            else Discovery(config, models=self.models, publish=self._outbox.publish)
        )
        self._metrics = threading.Thread(
            target=self._metrics_loop, name="edgeinfer-metrics", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, *, timeout_s: float | None = 30.0) -> Bridge:
        """Start the worker and connect; wait until subscribed (``timeout_s`` None: don't wait).

        Raises:
            BrokerAuthError: the broker refused the connection (bad credentials, not authorized).
            BrokerUnavailableError: not subscribed within ``timeout_s`` (a ``TimeoutError`` too).
        """
        self.worker.start()
        self.delivery.start()
        self.delivery.restart()  # what a killed bridge left unanswered
        if self.deployer is not None:
            self.deployer.start()
        connect_async(
            self._client,
            self.config.session,
            max_packet_bytes=self.config.max_packet_bytes(
                other_bytes=0 if self.deployer is None else self.deployer.max_message_bytes
            ),
        )
        self._client.loop_start()
        if self.config.metrics_interval_s > 0:
            self._metrics.start()
        if timeout_s is not None:
            self.wait_ready(timeout_s=timeout_s)
        return self

    def wait_ready(self, *, timeout_s: float) -> None:
        """Block until subscribed.

        Raises:
            BrokerAuthError: the broker refused the connection or the subscription.
            BrokerUnavailableError: not subscribed within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not self._state.subscribed.wait(0.05):
            if self._state.refused is not None:
                self.stop()
                raise BrokerAuthError(f"the broker refused the bridge: {self._state.refused}")
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(f"bridge not subscribed within {timeout_s} s")

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Finish queued requests, mark the status offline, disconnect."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.deployer is not None:
            self.deployer.stop()
        self.worker.stop(timeout_s=timeout_s)
        self.delivery.settle(timeout_s=timeout_s)  # the replies held for a commit go out too
        if self._availability is not None:
            self._availability.stop(timeout_s=timeout_s)
        if self._state.connected.is_set():
            offline = presence.offline(self.config.connection.client_id, self.deployer)
            info = self._outbox.publish(self.config.status_topic, offline, qos=1, retain=True)
            try:
                info.wait_for_publish(timeout_s)
            except (RuntimeError, ValueError):  # the link dropped meanwhile: the Will says it
                log.warning("could not publish the offline status; the Last Will will")
        self._client.disconnect()
        self._client.loop_stop()
        self.delivery.stop()  # the replies acknowledged so far are marked answered
        if self._metrics.is_alive():
            self._metrics.join()

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def connected(self) -> bool:
        """Whether the bridge is connected to the broker now."""
        return self._state.connected.is_set()

    @property
    def refused(self) -> str | None:
        """Why the broker refused the connection (bad credentials, ...), or ``None``."""
        return self._state.refused

    @property
    def connects(self) -> int:
        """Successful connections so far (more than 1 means it reconnected)."""
        return self._state.connects

    @property
    def refusals(self) -> int:
        """QoS 1 publishes the broker refused so far (each topic's first one is logged)."""
        return self._outbox.refusals

    def status(self) -> dict[str, Any]:
        """The retained status: ``online`` and each served model's digest and signer."""
        return presence.online(self.config.connection.client_id, self.models, self.deployer)

    # -- paho callbacks (network thread: no model work here) ----------------------------------
    def _on_connect(
        self,
        client: PahoClient,
        userdata: Any,
        flags: ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            self._state.refused = str(reason)
            log.error("broker refused the connection: %s", reason)
            client.disconnect()  # stop paho retrying with credentials that cannot work
            return
        self._state.connects += 1
        self._state.connected.set()
        if self.config.shared_group and getattr(properties, "SharedSubscriptionAvailable", 1) == 0:
            log.error(
                "the broker says it has no shared subscriptions: as a member of group %r this "
                "bridge gets no requests; give each bridge its own --device-id on this broker",
                self.config.shared_group,
            )
        log.info(
            "connected to %s (session present: %s)",
            self.config.connection.broker,
            flags.session_present,
        )
        topics: list[tuple[str, Any]] = [
            (self.config.subscription, intake.request_options(self.config))
        ]
        if self.deployer is not None:  # P/D/+/req does not match these (nor a request ACL)
            topics += [(self.config.ota_control_topic, 1), (self.config.ota_chunk_topic, 1)]
        client.subscribe(topics)  # one SUBACK: subscribed means every topic is
        self._publish_status()
        if self._discovery is not None:
            self._discovery.connected(client)

    def _on_subscribe(
        self,
        client: PahoClient,
        userdata: Any,
        mid: int,
        reasons: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        if any(r.is_failure for r in reasons):
            log.error("subscription to %s refused: %s", self.config.subscription, reasons)
            self._state.refused = f"subscription refused: {reasons}"
            return
        self._state.subscribed.set()
        if self._availability is not None:  # "online" once requests can be taken
            self._availability.start()

    def _on_disconnect(
        self,
        client: PahoClient,
        userdata: Any,
        flags: DisconnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._state.connected.clear()
        if not self._stop.is_set():
            log.warning("disconnected (%s); reconnecting with backoff", reason)

    def _on_publish(
        self,
        client: PahoClient,
        userdata: Any,
        mid: int,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._outbox.acknowledged(mid, reason)

    def _on_message(self, client: PahoClient, userdata: Any, message: MQTTMessage) -> None:
        # Nothing may escape: an exception here would end paho's network thread (the bridge
        # alive but deaf). It is acknowledged (after its row's commit) whatever happened:
        # recorded, answered, or (a poison) answered with an error, so it is consumed once.
        try:
            self._handle(message)
        except Exception:
            log.exception("dropped a message that could not be handled (acknowledged)")
            self._reply_unhandled(message)
        finally:
            self.delivery.acknowledge(message.mid, message.qos)

    def _handle(self, message: MQTTMessage) -> None:
        received_ms = self._clock()
        if self.deployer is not None and message.topic == self.config.ota_chunk_topic:
            self.deployer.handle_chunk(bytes(message.payload))
            return
        if self.deployer is not None and message.topic == self.config.ota_control_topic:
            self.deployer.handle_control(bytes(message.payload))
            return
        if self._discovery is not None and self._discovery.took(message):
            return  # a group member's status
        inbound = Inbound.of(message, received_ms=received_ms)
        if not inbound.payload and (message.retain or inbound.response_topic is None):
            return  # a retained request being cleared (ours, say): nothing asked, no one to tell
        if message.retain:  # refused and cleared: it would run at every new subscription
            log.warning("refused and cleared a retained request on %s", inbound.topic)
            self._outbox.publish(inbound.topic, b"", qos=1, retain=True)
            self.worker.submit(intake.retained_refusal(inbound, self.config))
            return
        self.delivery.accept(inbound, intake.decode(inbound, self.config), message.qos)

    def _reply_unhandled(self, message: MQTTMessage) -> None:
        """Answer a message that broke its handler (``intake.unhandled_reply``); never raises."""
        try:
            self.worker.submit(intake.unhandled_reply(message, self.config))
        except Exception:
            log.exception("could not answer the dropped message")

    # -- publishing (any thread; paho's publish is thread-safe; outbox.py) ---------------------
    def _send(self, out: Outgoing) -> None:
        self._outbox.send(out)

    def _publish_status(self) -> None:
        payload = json.dumps(self.status()).encode()
        self._outbox.publish(self.config.status_topic, payload, qos=1, retain=True)

    def _publish_deploy_status(self, status: dict[str, Any], retain: bool) -> None:
        payload = json.dumps({**status, "ts_ms": epoch_ms()}).encode()
        self._outbox.publish(self.config.ota_status_topic, payload, qos=1, retain=retain)

    def _metrics_loop(self) -> None:
        while not self._stop.wait(self.config.metrics_interval_s):
            snapshot = self.worker.snapshot()
            snapshot.update(
                client_id=self.config.connection.client_id,
                ts_ms=epoch_ms(),
                models=self.models.names(),
                journal=self.delivery.snapshot(),
            )
            self._outbox.publish(self.config.metrics_topic, json.dumps(snapshot).encode(), qos=0)
