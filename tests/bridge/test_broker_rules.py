"""Broker rules are visible: a publish the broker refuses (MQTT v5 PUBACK reason code >= 0x80,
here mosquitto's ``Not authorized`` under an ACL that forgot Home Assistant's discovery topics)
is logged once per topic, with the topic and the fix, by a real bridge on a real mosquitto.

Before, paho's on_publish got the reason code and dropped it: the bridge logged nothing while
Home Assistant saw no discovery config at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_harness import Mosquitto, require_mosquitto, wait_until

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection
from edgeinfer.bridge.serve.homeassistant import discovery_messages

# The bridge may read requests and write its own topics and the replies, but not discovery.
ACL = """user bridge
topic read edgeinfer/plc7/+/req
topic write edgeinfer/plc7/#
topic write edgeinfer/clients/+/reply
"""


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    require_mosquitto()
    server = Mosquitto(tmp_path / "mosquitto")
    server.require_logins({"bridge": "pw-bridge"}, ACL)
    server.start()
    yield server
    server.stop()


def test_a_refused_publish_is_logged_once_per_topic_with_the_fix(
    acl_broker: Mosquitto, fast_encoder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = BridgeConfig(
        connection=Connection(
            broker=acl_broker.url, client_id="plc7-bridge", username="bridge", password="pw-bridge"
        ),
        device_id="plc7",
        ha_discovery_prefix="homeassistant",
        metrics_interval_s=60,
        journal_dir=None,
    )
    caplog.set_level(logging.ERROR, logger="edgeinfer.bridge.serve.outbox")
    with Bridge({"tiny": edgeinfer.load(fast_encoder, threads=1)}, config=config) as bridge:
        # every discovery config is refused once (a refusal is counted before it is logged,
        # on paho's thread: wait for both)
        configs = len(discovery_messages(config, {"tiny": "embed"}))
        wait_until(lambda: bridge.refusals >= configs and len(caplog.records) >= configs)
        refused = {r.args[0] for r in caplog.records if r.args}  # type: ignore[index]
        assert len(refused) == configs and all(t.startswith("homeassistant/") for t in refused)
        acl_broker.kill9()  # the bridge reconnects, and publishes the configs again
        acl_broker.start()
        wait_until(lambda: bridge.refusals >= 2 * configs)
    assert len(caplog.records) == configs  # once per topic, not once per publish
    message = caplog.records[0].getMessage()
    assert "homeassistant/" in message and "Not authorized" in message and "ACL" in message


def test_a_group_member_says_when_the_broker_has_no_shared_subscriptions(
    own_broker: Mosquitto, fast_encoder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # mosquitto has shared subscriptions, and the v5 brokers here that lack them do not exist
    # (aedes and amqtt speak 3.1.1 only): the CONNACK of such a broker is made by hand, its
    # property as MQTT v5 §3.2.2.3.18 defines it, and given to the running bridge's callback.
    from paho.mqtt.client import ConnectFlags
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    config = BridgeConfig(
        connection=Connection(broker=own_broker.url, client_id="member-x"),
        device_id="plc7",
        shared_group="workers",
        metrics_interval_s=0,
        journal_dir=None,
    )
    caplog.set_level(logging.ERROR, logger="edgeinfer.bridge.serve.mqtt")
    with Bridge({"tiny": edgeinfer.load(fast_encoder, threads=1)}, config=config) as bridge:
        assert not caplog.records  # mosquitto's CONNACK: shared subscriptions available
        connack = Properties(PacketTypes.CONNACK)
        connack.SharedSubscriptionAvailable = 0
        flags = ConnectFlags(session_present=False)
        bridge._on_connect(bridge._client, None, flags, ReasonCode(PacketTypes.CONNACK), connack)
    (record,) = caplog.records
    assert "no shared subscriptions" in record.getMessage() and "--device-id" in record.getMessage()
