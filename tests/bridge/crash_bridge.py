"""A bridge process for the crash tests: serves one package as model ``m`` on device ``crash``.

``python crash_bridge.py BROKER_URL PACKAGE [--hold]``: with ``--hold`` every request stops
where a long one would be when the power goes (a generation after its first streamed chunk, a
tensor request inside ``run``) and waits there until the process is killed. It prints
``ready`` once subscribed. The request journal lives in ``$EDGEINFER_STATE_DIR``.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection

CLIENT_ID = "crash-bridge"  # the same at every start: the broker keeps its session
GENERATIONS = 3  # decoded together (continuous batching)


class Held:
    """The real model, whose requests never finish (until the process is killed)."""

    def __init__(self, model: Any) -> None:
        self.model, self.task, self.manifest = model, model.task, model.manifest
        self.max_sequences = getattr(model, "max_sequences", 1)
        self._never = threading.Event()

    def stream(self, prompt: Any, **options: Any) -> Iterator[Any]:
        chunks = self.model.stream(prompt, **options)
        try:
            for chunk in chunks:
                yield chunk
                if chunk.text:  # the lane has streamed it: now the generation is "long"
                    self._never.wait()
        finally:
            chunks.close()

    def run(self, feeds: Any, *, stream: str | None = None) -> Any:
        self._never.wait()
        return self.model.run(feeds, stream=stream)


def main(argv: list[str]) -> int:
    broker, package = argv[0], argv[1]
    manifest = edgeinfer.Manifest.read(package)
    batching = edgeinfer.ContinuousBatchConfig(max_sequences=GENERATIONS)
    model: Any = edgeinfer.load(
        package,
        threads=1,
        continuous_batching=batching if manifest.task == "generate" else None,
    )
    if "--hold" in argv:
        model = Held(model)
    config = BridgeConfig(
        connection=Connection(broker=broker, client_id=CLIENT_ID),
        device_id="crash",
        metrics_interval_s=0,
        max_generations=GENERATIONS,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Bridge({"m": model}, config=config):
        print("ready", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
