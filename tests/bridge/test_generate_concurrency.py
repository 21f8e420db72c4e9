"""Several devices' generations on one model at once, over a real mosquitto with plain paho
devices: four are decoded together (each one's first chunk comes while the others are still
running), the next four wait in the queue, the ninth is answered ``busy``; each answer is the
text the model gives that prompt alone."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import Mosquitto, PahoPeer

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection
from edgeinfer.config import ContinuousBatchConfig


class HeldModel:
    """The real tiny decoder under continuous batching; each generation's lane thread waits
    after sending its first chunk until ``gate`` opens (the engine keeps decoding meanwhile)."""

    def __init__(self, model: edgeinfer.Model) -> None:
        self.model, self.task, self.manifest = model, model.task, model.manifest
        self.max_sequences, self.generation_stats = model.max_sequences, model.generation_stats
        self.gate = threading.Event()
        self.first_chunks = threading.Semaphore(0)

    def stream(self, prompt: Any, **kwargs: Any) -> Iterator[Any]:
        for i, chunk in enumerate(self.model.stream(prompt, **kwargs)):
            yield chunk
            if i == 0:
                self.first_chunks.release()
                assert self.gate.wait(60)


def test_four_devices_are_answered_together_the_rest_queue_then_busy(
    broker: Mosquitto, fast_decoder: Path
) -> None:
    model = edgeinfer.load(
        fast_decoder, threads=1, continuous_batching=ContinuousBatchConfig(max_sequences=4)
    )
    prompts = [f"valve {i} reads" for i in range(9)]
    alone = [
        model.generate(p, max_new_tokens=16, sampling=edgeinfer.SamplingConfig()).text
        for p in prompts
    ]
    held = HeldModel(model)
    config = BridgeConfig(
        connection=Connection(broker=broker.url, client_id="b-gateway"),
        device_id="gateway",
        metrics_interval_s=0,
        max_generations=4,
        max_generate_queue=4,
    )
    bridge = Bridge({"tiny": held}, config=config).start()
    devices = [PahoPeer(broker.port, f"gw-device-{i}") for i in range(9)]
    try:
        sent = []
        for i in range(4):
            body = {"id": f"r{i}", "prompt": prompts[i], "max_new_tokens": 16}
            sent.append(devices[i].send("gateway", "tiny", body))
        for _ in range(4):  # four generations each sent a chunk while none has finished
            assert held.first_chunks.acquire(timeout=60)
        for device, correlation in zip(devices, sent, strict=False):
            with device._cond:  # the chunk on its way to the device
                assert device._cond.wait_for(partial(device.of, correlation), timeout=60)
            assert all("chunk" in m for m in device.of(correlation))  # no final yet
        assert bridge.worker.lane("tiny").running == 4
        for i in range(4, 8):
            body = {"id": f"r{i}", "prompt": prompts[i], "max_new_tokens": 16}
            sent.append(devices[i].send("gateway", "tiny", body))
        ninth = devices[8].send("gateway", "tiny", {"id": "r8", "prompt": prompts[8]})
        assert devices[8].final(ninth)["error"]["code"] == "busy"
        assert bridge.worker.lane("tiny").depth == 4  # the fifth to eighth wait their turn
        held.gate.set()
        for i, (device, correlation) in enumerate(zip(devices[:8], sent, strict=True)):
            final = device.final(correlation)
            chunks = [m for m in device.of(correlation) if "chunk" in m]
            assert final["ok"] and [c["chunk"] for c in chunks] == list(range(len(chunks)))
            assert "".join(c["text"] for c in chunks) == final["result"]["text"] == alone[i]
        stats = bridge.worker.snapshot()["per_model"]["tiny"]["generation"]  # the metrics topic's
        assert stats["active"] == 0 and stats["kv_bytes"] == 0 and stats["max_sequences"] == 4
        assert stats["tokens"] >= 8 and stats["inter_token_ms_p50"] > 0
    finally:
        for device in devices:
            device.close()
        bridge.stop()
        model.close()


def test_serve_batches_generate_packages_that_can_and_says_when_one_cannot(
    fast_decoder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from edgeinfer.bridge.models import batching_for

    manifest = edgeinfer.Manifest.read(fast_decoder)
    config = batching_for(manifest, generations=4, kv_budget_bytes=16 << 20)
    assert config == ContinuousBatchConfig(max_sequences=4, kv_budget_bytes=16 << 20)
    # one at a time: the solo path
    assert batching_for(manifest, generations=1, kv_budget_bytes=None) is None
    older = dataclasses.replace(manifest, io=dataclasses.replace(manifest.io, extra_row_input=None))
    with caplog.at_level(logging.WARNING):
        assert batching_for(older, generations=4, kv_budget_bytes=None) is None
    assert "re-export" in caplog.text
