"""The operator's side of a deploy: send a signed package to a device, or roll it back.

``deploy_package`` publishes ``begin`` (the signed manifest), reads from the device's status
which chunks it still lacks (all of them, or those a broken earlier try did not deliver),
sends them at QoS 1, each with its sha256, then ``commit``; a status that still lists missing
chunks (a message lost with a broker) gets those sent again. It returns the final status:
``active`` or ``failed`` (with the device's reason). Statuses are matched by a nonce sent
with ``begin``, so an older retained status is never taken for this deploy's.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.bridge import protocol as proto
from edgeinfer.bridge.connection import Connection, Handshake, connect_async, new_paho_client
from edgeinfer.bridge.signing import read_signature
from edgeinfer.bridge.staging import DEFAULT_CHUNK_BYTES, chunk_plan
from edgeinfer.errors import BridgeError, ConfigError, RequestTimeoutError
from edgeinfer.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient

__all__ = ["DeployOutcome", "deploy_package", "rollback_package"]

_FINAL = frozenset({"active", "failed", "rolled_back"})
_ANY = frozenset({"receiving", "verifying", "loading", "smoke_check"}) | _FINAL
# Re-send begin/rollback after this long without any status (the device repeats none twice).
_RESEND_S = 5.0


@dataclass(frozen=True)
class DeployOutcome:
    """How a deploy or rollback ended: the device's last status and what was sent."""

    status: dict[str, Any]
    chunks_sent: int = 0
    chunks_total: int = 0

    @property
    def ok(self) -> bool:
        """Whether the device serves the package now."""
        return self.status.get("state") in ("active", "rolled_back")


class _Link:
    """A paho client that publishes deploy messages and collects statuses with one nonce."""

    def __init__(self, connection: Connection, base: str, nonce: str, timeout_s: float) -> None:
        self.req, self.status_topic = f"{base}/deploy/req", f"{base}/deploy/status"
        self.nonce = nonce
        self.statuses: queue.Queue[dict[str, Any]] = queue.Queue()
        self._handshake = Handshake(connection)
        self.client: PahoClient = new_paho_client(connection)
        self.client.max_inflight_messages_set(16)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda c, u, mid, reasons, p: self._handshake.subscribed(reasons)
        self.client.on_message = self._on_message
        connect_async(self.client, connection)
        self.client.loop_start()
        try:
            self._handshake.wait(timeout_s=timeout_s)  # a refused login: BrokerAuthError at once
        except BridgeError:
            self.close()
            raise

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if self._handshake.connected(reason):
            client.subscribe(self.status_topic, qos=1)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        try:
            status = json.loads(message.payload)
        except ValueError:
            return
        if isinstance(status, dict) and status.get("nonce") == self.nonce:
            self.statuses.put(status)

    def send(self, message: dict[str, Any]) -> Any:
        return self.client.publish(self.req, proto.packb({**message, "nonce": self.nonce}), qos=1)

    def wait(self, states: frozenset[str], deadline: float, round_: int) -> dict[str, Any]:
        """The first status of this nonce and ``round_`` in one of ``states``."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeoutError(
                    "no answer from the device's bridge in time; is it "
                    "serving with --deploy-dir and reachable?"
                )
            try:
                status = self.statuses.get(timeout=left)
            except queue.Empty:
                continue
            if status.get("state") in states and status.get("round") == round_:
                return status

    def request(self, message: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Send ``message`` until a first status answers it (a bridge not yet subscribed,
        just started or reconnecting, never saw the earlier copies); return that status."""
        while True:
            self.send(message)
            try:
                return self.wait(_ANY, min(deadline, time.monotonic() + _RESEND_S), 0)
            except RequestTimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def deploy_package(
    package: Path,
    *,
    connection: Connection,
    device_id: str,
    topic_prefix: str = "edgeinfer",
    name: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    timeout_s: float = 600.0,
    max_rounds: int = 5,
) -> DeployOutcome:
    """Send a signed package to ``device_id``'s bridge and wait until it serves it (or not).

    Raises:
        ConfigError: the package is not signed, or does not verify here already.
        BrokerAuthError: the broker refused the login (user name, password).
        BrokerUnavailableError, RequestTimeoutError: no broker, or no final status in time.
    """
    package = Path(package)
    manifest_bytes = (package / MANIFEST_NAME).read_bytes()
    manifest = Manifest.from_dict(json.loads(manifest_bytes))
    manifest.verify(package)  # never ship a damaged package
    signature = read_signature(package)
    if signature is None:
        raise ConfigError(f"{package} is not signed; run `edgeinfer sign {package} --key KEY`")
    name = name or package.resolve().name
    deploy_id = f"{name}-{hashlib.sha256(manifest_bytes).hexdigest()[:16]}"
    plan = chunk_plan(manifest.files, chunk_bytes)
    deadline = time.monotonic() + timeout_s
    link = _Link(connection, f"{topic_prefix}/{device_id}", os.urandom(8).hex(), timeout_s)
    sent = 0
    try:
        begin = {
            "op": "begin",
            "deploy_id": deploy_id,
            "name": name,
            "round": 0,
            "chunk_bytes": chunk_bytes,
            "manifest": manifest_bytes,
            "signature": signature,
        }
        status = link.request(begin, deadline)
        for round_ in range(1, max_rounds + 1):
            if status["state"] != "receiving":
                break
            pending = [link.send(_chunk(package, plan[i], deploy_id)) for i in status["missing"]]
            sent += len(pending)
            for info in pending:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            link.send({"op": "commit", "deploy_id": deploy_id, "round": round_})
            status = link.wait(_FINAL | {"receiving"}, deadline, round_)
        return DeployOutcome(status, sent, len(plan))
    finally:
        link.close()


def _chunk(package: Path, ref: Any, deploy_id: str) -> dict[str, Any]:
    with (package / ref.file).open("rb") as f:
        f.seek(ref.offset)
        data = f.read(ref.size)
    return {
        "op": "chunk",
        "deploy_id": deploy_id,
        "index": ref.index,
        "file": ref.file,
        "offset": ref.offset,
        "sha256": hashlib.sha256(data).hexdigest(),
        "data": data,
    }


def rollback_package(
    name: str,
    *,
    connection: Connection,
    device_id: str,
    topic_prefix: str = "edgeinfer",
    timeout_s: float = 300.0,
) -> DeployOutcome:
    """Ask ``device_id``'s bridge to serve ``name``'s previous package again."""
    link = _Link(connection, f"{topic_prefix}/{device_id}", os.urandom(8).hex(), timeout_s)
    try:
        rollback = {"op": "rollback", "name": name, "round": 0}
        deadline = time.monotonic() + timeout_s
        status = link.request(rollback, deadline)
        return DeployOutcome(
            status if status["state"] in _FINAL else link.wait(_FINAL, deadline, 0)
        )
    finally:
        link.close()
