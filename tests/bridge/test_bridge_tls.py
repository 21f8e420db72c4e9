"""TLS + password, required and enforced: the right credentials work, wrong ones are refused."""

from __future__ import annotations

import pytest
from bridge_harness import Harness, Mosquitto

from edgeinfer.bridge import Client, Connection
from edgeinfer.errors import BrokerAuthError, BrokerUnavailableError


def test_bridge_and_client_over_tls_with_a_password(
    secure_broker: Mosquitto, harness: Harness
) -> None:
    assert secure_broker.url.startswith("mqtts://")
    harness.bridge(secure_broker, device_id="secure")
    client = harness.client(secure_broker, device_id="secure")
    reply = client.request("minilm", text="encrypted and authenticated")
    assert reply["ok"] and len(reply["result"][0]) == 384


def test_a_wrong_password_is_refused(secure_broker: Mosquitto, harness: Harness) -> None:
    with pytest.raises(BrokerAuthError, match="refused"):
        harness.client(secure_broker, device_id="secure", password="wrong")
    with pytest.raises(BrokerAuthError, match="refused"):
        harness.bridge(secure_broker, device_id="intruder", password="wrong")


def test_anonymous_clients_are_refused(secure_broker: Mosquitto) -> None:
    assert secure_broker.secure is not None
    connection = Connection(
        broker=secure_broker.url, client_id="anonymous", tls_ca=secure_broker.secure.ca
    )
    with pytest.raises(BrokerAuthError, match="refused"):
        Client(connection=connection, device_id="secure").connect(timeout_s=30)


def test_plain_tcp_to_the_tls_port_does_not_connect(secure_broker: Mosquitto) -> None:
    assert secure_broker.secure is not None
    connection = Connection(
        broker=f"mqtt://127.0.0.1:{secure_broker.port}",
        client_id="plain",
        username=secure_broker.secure.username,
        password=secure_broker.secure.password,
    )
    with pytest.raises(BrokerUnavailableError):  # the TLS listener never answers a plain CONNECT
        Client(connection=connection, device_id="secure").connect(timeout_s=3)


def test_an_untrusted_server_certificate_is_rejected(
    secure_broker: Mosquitto,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from bridge_harness import make_certificates

    other_ca, _, _ = make_certificates(tmp_path_factory.mktemp("other-pki"))
    assert secure_broker.secure is not None
    connection = Connection(
        broker=secure_broker.url,
        client_id="mitm-victim",
        username=secure_broker.secure.username,
        password=secure_broker.secure.password,
        tls_ca=other_ca,
    )
    with pytest.raises(BrokerUnavailableError):  # the handshake fails on every attempt
        Client(connection=connection, device_id="secure").connect(timeout_s=3)
