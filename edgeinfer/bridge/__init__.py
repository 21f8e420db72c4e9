"""The MQTT bridge: serve edgeinfer models to MQTT devices with request/response and deadlines.

``Bridge`` serves (``edgeinfer serve`` is its command line), ``Client`` asks, ``protocol`` is the
wire format (pure, no paho). docs/mqtt.md is the contract. Needs the ``mqtt`` extra (paho-mqtt).
"""

from edgeinfer.bridge.client import Client
from edgeinfer.bridge.connection import Connection, parse_broker_url
from edgeinfer.bridge.mqtt import Bridge, BridgeConfig, default_client_id
from edgeinfer.bridge.protocol import ERROR_CODES, ErrorReply, Request
from edgeinfer.bridge.worker import Worker

__all__ = [
    "ERROR_CODES",
    "Bridge",
    "BridgeConfig",
    "Client",
    "Connection",
    "ErrorReply",
    "Request",
    "Worker",
    "default_client_id",
    "parse_broker_url",
]
