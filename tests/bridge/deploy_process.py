"""A bridge that takes deploys, as its own process (``python deploy_process.py ...``): what
``edgeinfer serve PKG --deploy-dir DIR --trusted-key PUB`` runs, with the deploy check's
limits given. It serves ``--origin`` as ``--name`` until SIGTERM or SIGINT, then stops as
``serve`` does (``Bridge.stop``) and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection, DeployConfig, TrustedKeys


def _load(path: Path) -> edgeinfer.Model:
    return edgeinfer.load(path, config=edgeinfer.RuntimeConfig(spin_wait=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for option in ("--broker", "--device", "--deploy-dir", "--trusted-key", "--origin", "--name"):
        parser.add_argument(option, required=True)
    parser.add_argument("--check-timeout-s", type=float, required=True)
    parser.add_argument("--check-memory-mb", type=int)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    memory = None if args.check_memory_mb is None else args.check_memory_mb << 20
    bridge = Bridge(
        {args.name: _load(Path(args.origin))},
        config=BridgeConfig(
            connection=Connection(broker=args.broker, client_id=f"proc-{args.device}"),
            device_id=args.device,
            metrics_interval_s=0,
        ),
        deploy=DeployConfig(
            folder=Path(args.deploy_dir),
            trusted=TrustedKeys.load([Path(args.trusted_key)]),
            loader=_load,
            check_timeout_s=args.check_timeout_s,
            check_memory_bytes=memory,
        ),
        origins={args.name: Path(args.origin)},
    )
    assert bridge.deployer is not None
    for name, model in bridge.deployer.restore().items():
        bridge.models.swap(name, model)
    bridge.start(timeout_s=60)
    try:
        stop.wait()
    finally:
        bridge.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
