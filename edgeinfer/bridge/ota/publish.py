"""The operator's side of a deploy: send a signed release to a device, or roll it back.

``deploy_package`` publishes ``begin`` (the signed manifest and release) on ``P/D/ota/ctl``,
reads from the device's status which chunks it still lacks (all of them, or those a broken
earlier try did not deliver), sends them on ``P/D/ota/chunk`` at QoS 1, each with its sha256,
then ``commit``; a status that still lists missing chunks (a message lost with a broker) gets
those sent again. It returns the final status: ``active``, ``failed`` or ``refused`` (with the
device's ``reason``). Statuses are matched by a nonce sent with every message, so an older
retained status is never taken for this deploy's. ``rollback_package`` sends a signed order
naming the package to go back to (default: the ``previous`` the device's status reports).
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

from edgeinfer.bridge.connection import Connection, subscriber
from edgeinfer.bridge.ota.release import DEFAULT_ROLLBACK_EXPIRES_S, read_signature, sign_rollback
from edgeinfer.bridge.ota.staging import DEFAULT_CHUNK_BYTES, MAX_CONTROL_BYTES, chunk_plan
from edgeinfer.bridge.wire import protocol as proto
from edgeinfer.errors import ConfigError, RequestTimeoutError
from edgeinfer.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from paho.mqtt.client import Client as PahoClient

__all__ = ["DeployOutcome", "deploy_package", "rollback_package"]

# "trial": the device serves the package in its trial window (its verdict follows:
# "committed" or "rolled_back", see ``await_verdict``).
_FINAL = frozenset({"active", "trial", "committed", "failed", "refused", "rolled_back"})
_ANY = frozenset({"receiving", "verifying", "checking", "loading", "smoke_check"}) | _FINAL
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
        return self.status.get("state") in ("active", "trial", "committed", "rolled_back")


class _Link:
    """A paho client that publishes deploy messages and collects statuses with one nonce."""

    def __init__(self, connection: Connection, base: str, nonce: str, timeout_s: float) -> None:
        self.ctl, self.chunks = f"{base}/ota/ctl", f"{base}/ota/chunk"
        self.status_topic, self.device_topic = f"{base}/ota/status", f"{base}/status"
        self.nonce = nonce
        self.statuses: queue.Queue[dict[str, Any]] = queue.Queue()
        self.device: queue.Queue[dict[str, Any]] = queue.Queue()  # P/D/status (retained)
        topics = [(self.status_topic, 1), (self.device_topic, 1)]
        # A refused login: BrokerAuthError at once.
        self.client: PahoClient = subscriber(
            connection, topics, self._on_message, timeout_s=timeout_s, max_inflight=16
        )

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        try:
            status = json.loads(message.payload)
        except ValueError:
            return
        if not isinstance(status, dict):
            return
        if message.topic == self.device_topic:
            self.device.put(status)
        elif status.get("nonce") == self.nonce:
            self.statuses.put(status)

    def send(self, message: dict[str, Any], *, topic: str | None = None) -> Any:
        payload = proto.packb({**message, "nonce": self.nonce})
        return self.client.publish(topic or self.ctl, payload, qos=1)

    def previous(self, name: str, deadline: float) -> str:
        """The digest of ``name``'s previous package, as the device's status reports it."""
        try:
            status = self.device.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty as exc:
            raise RequestTimeoutError("the device published no status; is its bridge up?") from exc
        previous = (status.get("models") or {}).get(name, {}).get("previous")
        if not previous:
            raise ConfigError(
                f"the device reports no previous package for {name!r}: nothing to roll back to"
            )
        return str(previous)

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
    connect_timeout_s: float = 10.0,
) -> DeployOutcome:
    """Send a signed release to ``device_id``'s bridge and wait until it serves it (or not).

    Args:
        name: the served name (default: the one the release is signed for).
        connect_timeout_s: no broker connection within this: ``BrokerUnavailableError`` then
            (``timeout_s`` is for the device's answer).

    Raises:
        ConfigError: the package is not signed as a release, or does not verify here already.
        BrokerAuthError: the broker refused the login (user name, password).
        BrokerUnavailableError, RequestTimeoutError: no broker, or no final status in time.
    """
    package = Path(package)
    manifest_bytes = (package / MANIFEST_NAME).read_bytes()
    manifest = Manifest.parse(manifest_bytes, source=str(package / MANIFEST_NAME))
    manifest.verify(package)  # never ship a damaged package
    signature = read_signature(package)
    if signature is None or not isinstance(signature.get("release"), dict):
        raise ConfigError(
            f"{package} is not signed as a release; run "
            f"`edgeinfer sign {package} --key KEY --device-id {device_id}`"
        )
    begin = {
        "op": "begin",
        "name": name or signature["release"].get("name"),
        "round": 0,
        "chunk_bytes": chunk_bytes,
        "manifest": manifest_bytes,
        "signature": signature,
    }
    if len(proto.packb(begin)) + 64 > MAX_CONTROL_BYTES:  # 64: the nonce added on sending
        raise ConfigError(f"the manifest and signature exceed {MAX_CONTROL_BYTES} bytes")
    plan = chunk_plan(manifest.files, chunk_bytes)
    deadline = time.monotonic() + timeout_s
    link = _Link(
        connection,
        f"{topic_prefix}/{device_id}",
        os.urandom(8).hex(),
        min(timeout_s, connect_timeout_s),
    )
    sent = 0
    try:
        status = link.request(begin, deadline)
        deploy_id = status.get("deploy_id")
        for round_ in range(1, max_rounds + 1):
            if status["state"] != "receiving":
                break
            pending = [
                link.send(_chunk(package, plan[i], deploy_id), topic=link.chunks)
                for i in status["missing"]
            ]
            sent += len(pending)
            for info in pending:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            link.send({"op": "commit", "deploy_id": deploy_id, "round": round_})
            status = link.wait(_FINAL | {"receiving"}, deadline, round_)
        return DeployOutcome(status, sent, len(plan))
    finally:
        link.close()


def _chunk(package: Path, ref: Any, deploy_id: Any) -> dict[str, Any]:
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
    key: Path,
    topic_prefix: str = "edgeinfer",
    to_digest: str | None = None,
    to_version: int | None = None,
    expires_in_s: float = DEFAULT_ROLLBACK_EXPIRES_S,
    timeout_s: float = 300.0,
    connect_timeout_s: float = 10.0,
) -> DeployOutcome:
    """Make ``device_id``'s bridge serve ``name``'s previous package again, by an order
    signed with ``key`` naming that package (``to_digest``/``to_version``; default: the
    previous digest the device's status reports)."""
    link = _Link(
        connection,
        f"{topic_prefix}/{device_id}",
        os.urandom(8).hex(),
        min(timeout_s, connect_timeout_s),
    )
    try:
        deadline = time.monotonic() + timeout_s
        if to_digest is None and to_version is None:
            to_digest = link.previous(name, deadline)
        order = sign_rollback(
            key,
            name=name,
            devices=[device_id],
            digest=to_digest,
            version=to_version,
            expires_in_s=expires_in_s,
        )
        status = link.request({"op": "rollback", "round": 0, **order}, deadline)
        return DeployOutcome(
            status if status["state"] in _FINAL else link.wait(_FINAL, deadline, 0)
        )
    finally:
        link.close()
