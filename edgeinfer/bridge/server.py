"""Serving as a library: ``serve(packages, settings=ServeSettings(...))``, or ``Server`` for a
program that starts and stops it itself (uvicorn's ``Config`` + ``Server.run()`` shape).
``edgeinfer serve`` only maps its flags to ``ServeSettings``.

A ``Server`` decides what serving a set of package folders takes: each package loaded once
(threads, the result cache for text packages, continuous batching per manifest, the memory
budget), the deploys it takes (trusted keys, the bounded check loading a package as it will be
served), what was deployed before a restart, the signal loop and the graceful stop.

Example::

    from edgeinfer.bridge import BridgeConfig, Connection, ServeSettings, serve

    bridge = BridgeConfig(connection=Connection(client_id="plc7"), device_id="plc7")
    serve(["pkg/encoder-int8"], settings=ServeSettings(bridge=bridge))  # until SIGINT/SIGTERM
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from edgeinfer.bridge.models import ServedModel, batching_for
from edgeinfer.bridge.ota.check import DEFAULT_CHECK_TIMEOUT_S, LoadOptions
from edgeinfer.bridge.ota.deploy_config import DeployConfig
from edgeinfer.bridge.ota.signing import TrustedKeys, read_revoked
from edgeinfer.bridge.serve.mqtt import Bridge
from edgeinfer.bridge.serve.settings import BridgeConfig
from edgeinfer.config import DEFAULT_RUN_TIMEOUT_S, CacheConfig, RuntimeConfig
from edgeinfer.errors import BrokerAuthError, BrokerUnavailableError, ConfigError

__all__ = ["DeploySettings", "ServeSettings", "Server", "serve"]

log = logging.getLogger(__name__)

_POLL_S = 0.5  # how often the loop looks at a broker refusal between stop requests
_TEXT_TASKS = ("embed", "classify")  # the tasks the result cache serves (text inputs)


@dataclass(frozen=True, kw_only=True)
class DeploySettings:
    """How a server takes signed packages over MQTT (``edgeinfer deploy``).

    Args:
        folder: where staging and the deployed packages (active and previous) live.
        trusted_keys: public key files (``edgeinfer keygen``'s ``.pub``) whose releases are
            taken; at least one.
        revoked: a file of revoked key ids (one a line): their signatures are refused.
        compatible: the device classes this device takes releases for (``sign --compatible``).
        check_timeout_s: seconds a new package's check (load, warm-up, smoke cases, in a child
            process) may take before it is killed and the deploy fails.
        check_memory_bytes: data memory that check may use (``None``: 3/4 of what is
            available when it starts).
    """

    folder: Path
    trusted_keys: tuple[Path, ...]
    revoked: Path | None = None
    compatible: tuple[str, ...] = ()
    check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    check_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.trusted_keys:
            raise ConfigError("deploys need at least one trusted key (a .pub file: --trusted-key)")


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """Everything a ``Server`` serves with.

    Args:
        bridge: the MQTT side: connection, topics, queues and limits, journal.
        threads: intra-op threads per model (``None``: onnxruntime's choice).
        cache: the result cache of text packages (embed, classify); ``None``: none.
        file_backed_prepacks: keep onnxruntime's prepacked weights in a file (evictable under
            a memory limit; ``RuntimeConfig.file_backed_prepacks``).
        run_timeout_s: seconds one graph run may take before it is stopped and its request
            answered ``run_timeout`` (``None``: no limit but the request's deadline).
        memory_budget_bytes: memory generations may grow into (``None``: the cgroup's limit).
        kv_budget_bytes: KV the generations of one model may need together (``None``: none).
        deploy: take signed packages over MQTT; ``None``: no deploys.
        ready_timeout_s: how long ``start`` waits for the broker; a broker that comes later
            is still connected to in the background (boot order).
    """

    bridge: BridgeConfig
    threads: int | None = None
    cache: CacheConfig | None = None
    file_backed_prepacks: bool = False
    run_timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S
    memory_budget_bytes: int | None = None
    kv_budget_bytes: int | None = None
    deploy: DeploySettings | None = None
    ready_timeout_s: float = 30.0


class Server:
    """Serve package folders over MQTT: ``run()`` until ``stop()`` (or SIGINT/SIGTERM when
    run on the main thread), or ``start()`` and ``stop()`` around code of one's own.

    Each package is served under its folder name (``P/D/<folder>/req``).
    """

    def __init__(self, packages: Sequence[Path | str], *, settings: ServeSettings) -> None:
        self.packages = [Path(p) for p in packages]
        self.names = [p.resolve().name for p in self.packages]
        if not self.packages:
            raise ConfigError("serve needs at least one package folder")
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"two packages share a folder name (the topic level): {self.names}")
        self.settings = settings
        # Several spinning sessions in one process fight for the cores: spin only with one.
        self._runtime = RuntimeConfig(
            spin_wait=len(self.packages) == 1,
            file_backed_prepacks=settings.file_backed_prepacks,
            memory_budget_bytes=settings.memory_budget_bytes,
            run_timeout_s=settings.run_timeout_s,
        )
        self.deploy_config: DeployConfig | None = None
        self.bridge: Bridge | None = None
        self._stop = threading.Event()
        self._running = False  # run() owns the bridge's stop

    def load(self, path: Path) -> ServedModel:
        """One package as this server serves it (verified and warmed up)."""
        import edgeinfer

        manifest = edgeinfer.Manifest.read(path)
        return edgeinfer.load(
            path,
            threads=self.settings.threads,
            config=self._runtime,
            cache=self.settings.cache if manifest.task in _TEXT_TASKS else None,
            continuous_batching=batching_for(
                manifest,
                generations=self.settings.bridge.generations,
                kv_budget_bytes=self.settings.kv_budget_bytes,
            ),
        )

    def start(self) -> Bridge:
        """Load every package, restore what was deployed before a restart, connect, and wait
        up to ``ready_timeout_s`` for the broker (later: keep trying in the background).

        Raises:
            BrokerAuthError: the broker refused the bridge.
        """
        models = {name: self.load(p) for name, p in zip(self.names, self.packages, strict=True)}
        self.deploy_config = self._deploy_config()
        bridge = Bridge(
            models,
            config=self.settings.bridge,
            deploy=self.deploy_config,
            origins=dict(zip(self.names, self.packages, strict=True)),
        )
        if bridge.deployer is not None:  # what was deployed before a restart is served again
            for name, model in bridge.deployer.restore().items():
                bridge.models.swap(name, model)
        self.bridge = bridge
        bridge.start(timeout_s=None)
        try:
            bridge.wait_ready(timeout_s=self.settings.ready_timeout_s)
        except BrokerUnavailableError:  # the broker may come up after us (boot order)
            log.warning(
                "%s not reachable yet; retrying in the background",
                self.settings.bridge.connection.broker,
            )
        return bridge

    def run(self, *, on_ready: Callable[[Server], None] | None = None) -> int:
        """Serve until ``stop()`` (or SIGINT/SIGTERM on the main thread), then finish the
        queued requests, publish ``offline`` and return 0. ``on_ready`` runs once started.

        Raises:
            BrokerAuthError: the broker refused the bridge (at the start or on a reconnect).
        """
        self._running = True
        previous = self._catch_signals()
        try:
            bridge = self.start()
            if on_ready is not None:
                on_ready(self)
            while not self._stop.wait(_POLL_S):
                if bridge.refused is not None:
                    raise BrokerAuthError(f"the broker refused the bridge: {bridge.refused}")
        finally:
            if self.bridge is not None:
                self.bridge.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._running = False
        return 0

    def stop(self) -> None:
        """Ask ``run`` to stop (from any thread or a signal handler); it returns once the
        bridge stopped. Without ``run``, stop the bridge ``start`` returned now."""
        self._stop.set()
        if self.bridge is not None and not self._running:
            self.bridge.stop()

    def _catch_signals(self) -> dict[int, Any]:
        """SIGINT and SIGTERM stop the server (only the main thread may set handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._stop.set()

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _deploy_config(self) -> DeployConfig | None:
        deploy = self.settings.deploy
        if deploy is None:
            return None
        revoked = read_revoked(deploy.revoked) if deploy.revoked else frozenset()
        settings = self.settings
        return DeployConfig(
            folder=deploy.folder,
            trusted=TrustedKeys.load(deploy.trusted_keys, revoked=revoked),
            loader=self.load,
            compatible=deploy.compatible,
            check_timeout_s=deploy.check_timeout_s,
            check_memory_bytes=deploy.check_memory_bytes,
            # The check loads a package as it will be served: the same sessions and warm-up.
            check_load=LoadOptions(
                threads=settings.threads,
                generations=settings.bridge.generations,
                kv_budget_bytes=settings.kv_budget_bytes,
                file_backed_prepacks=settings.file_backed_prepacks,
                memory_budget_bytes=settings.memory_budget_bytes,
            ),
        )


def serve(packages: Sequence[Path | str], *, settings: ServeSettings) -> int:
    """Serve ``packages`` over MQTT until SIGINT or SIGTERM; 0 after a clean stop
    (``Server(packages, settings=settings).run()``)."""
    return Server(packages, settings=settings).run()
