"""The MQTT bridge: serve edgeinfer models to MQTT devices with request/response and deadlines.

``serve(packages, settings=ServeSettings(...))`` and ``Server`` serve package folders
(``edgeinfer serve`` only maps its flags to ``ServeSettings``); ``Bridge`` serves loaded
models; ``Client`` asks; ``protocol`` and
``kinds`` are the wire format (pure, no paho), ``deploy``/``publish`` move signed packages to
devices. docs/mqtt.md is the contract. Needs the ``mqtt`` extra (paho-mqtt, msgpack,
cryptography); encoded images need the ``images`` extra (Pillow).
"""

from edgeinfer.bridge.client import Client
from edgeinfer.bridge.connection import Connection, parse_broker_url
from edgeinfer.bridge.ota.deploy import DeployConfig, Deployer
from edgeinfer.bridge.ota.publish import DeployOutcome, deploy_package, rollback_package
from edgeinfer.bridge.ota.release import sign_package
from edgeinfer.bridge.ota.signing import TrustedKeys, generate_keypair
from edgeinfer.bridge.serve.mqtt import Bridge
from edgeinfer.bridge.serve.settings import BridgeConfig, default_client_id
from edgeinfer.bridge.serve.worker import Worker
from edgeinfer.bridge.server import DeploySettings, Server, ServeSettings, serve
from edgeinfer.bridge.wire.failures import raise_for_error
from edgeinfer.bridge.wire.protocol import ERROR_CODES, PROTOCOL_VERSION, ErrorReply, Request

__all__ = [
    "ERROR_CODES",
    "PROTOCOL_VERSION",
    "Bridge",
    "BridgeConfig",
    "Client",
    "Connection",
    "DeployConfig",
    "DeployOutcome",
    "DeploySettings",
    "Deployer",
    "ErrorReply",
    "Request",
    "ServeSettings",
    "Server",
    "TrustedKeys",
    "Worker",
    "default_client_id",
    "deploy_package",
    "generate_keypair",
    "parse_broker_url",
    "raise_for_error",
    "rollback_package",
    "serve",
    "sign_package",
]
