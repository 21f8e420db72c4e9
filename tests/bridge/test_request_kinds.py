"""Every request kind over a real mosquitto, driven by a device written with plain paho:
text (both vector encodings, the reply cache), a camera frame (JPEG) and a raw frame for an
image classifier, a VAD-like stateful tensor stream, and streamed generation (chunks in order
and complete, stop strings, cancel, the first-token deadline, busy)."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from bridge_harness import CountingModel, FakeClock, Harness, Mosquitto, PahoPeer

import edgeinfer
from edgeinfer.bridge import Bridge, BridgeConfig, Connection
from edgeinfer.bridge.serve.serving import StreamTable
from edgeinfer.bridge.wire.frames import frames_to_batch
from edgeinfer.package_io import ImageClassifierIO


@pytest.fixture
def serve(broker: Mosquitto) -> Iterator[Any]:
    """``serve(device, models, **config)``: a started bridge, stopped after the test."""
    bridges: list[Bridge] = []

    def start(
        device: str, models: dict[str, Any], *, clock_ms: Any = None, **options: Any
    ) -> Bridge:
        config = BridgeConfig(
            connection=Connection(broker=broker.url, client_id=f"b-{device}"),
            device_id=device,
            metrics_interval_s=0,
            **options,
        )
        extra = {} if clock_ms is None else {"clock_ms": clock_ms}
        bridge = Bridge(models, config=config, **extra).start()
        bridges.append(bridge)
        return bridge

    yield start
    for bridge in bridges:
        bridge.stop()


@pytest.fixture
def peer(broker: Mosquitto, request: pytest.FixtureRequest) -> Iterator[PahoPeer]:
    device = PahoPeer(broker.port, request.node.name.replace("[", "-").replace("]", ""))
    yield device
    device.close()


# -- text --------------------------------------------------------------------------------------


def test_text_vectors_in_both_encodings_and_the_reply_cache(
    serve: Any, peer: PahoPeer, harness: Harness
) -> None:
    counting = CountingModel(harness.model)
    bridge = serve("kinds-text", {"minilm": counting}, reply_cache_bytes=1 << 20)
    expected = harness.model.embed(["pump 4 vibration high"])[0]
    shortest = peer.send("kinds-text", "minilm", {"id": "t1", "text": "pump 4 vibration high"})
    packed = peer.send(
        "kinds-text",
        "minilm",
        {"id": "t2", "text": "pump 4 vibration high", "encoding": "float32-base64"},
    )
    first, second = peer.final(shortest), peer.final(packed)
    assert np.array_equal(np.asarray(first["result"][0], np.float32), expected)
    assert np.array_equal(np.frombuffer(base64.b64decode(second["result"][0]), "<f4"), expected)
    assert counting.calls == 2 and first["v"] == 1
    # The same input again, under a new id: answered from the reply cache, no model run.
    again = peer.final(
        peer.send("kinds-text", "minilm", {"id": "t3", "text": "pump 4 vibration high"})
    )
    assert again["cached"] is True and again["result"] == first["result"]
    assert counting.calls == 2 and bridge.worker.counts["reply_cache_hit"] == 1


# -- images ------------------------------------------------------------------------------------


def camera_jpeg() -> tuple[bytes, np.ndarray]:
    """A real photo (scikit-learn's sample), 640x427, JPEG-encoded as a camera would send it."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photo = load_sample_images().images[1]  # [427, 640, 3] uint8
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), photo


def test_a_camera_frame_is_classified_end_to_end(
    serve: Any, peer: PahoPeer, effnet_package: Path
) -> None:
    model = edgeinfer.load(effnet_package, threads=1)
    serve("camera", {"effnet": model}, max_payload_bytes=2 << 20)  # a raw 640x427 frame
    jpeg, photo = camera_jpeg()
    encoded = peer.send(
        "camera", "effnet", {"id": "frame-1", "image": {"format": "jpeg", "data": jpeg}}
    )
    raw = peer.send(
        "camera",
        "effnet",
        {
            "id": "frame-2",
            "image": {"dtype": "uint8", "shape": list(photo.shape), "data": photo.tobytes()},
        },
    )
    exact = np.zeros((224, 224, 3), np.uint8)
    exact[50:150, 60:160] = 200
    same_size = peer.send(
        "camera",
        "effnet",
        {
            "id": "frame-3",
            "images": [{"dtype": "uint8", "shape": [224, 224, 3], "data": exact.tobytes()}],
        },
    )
    bad = peer.send(
        "camera", "effnet", {"id": "frame-4", "image": {"format": "png", "data": b"not a png"}}
    )
    from PIL import Image

    decoded = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    for correlation, frame in ((encoded, decoded), (raw, photo), (same_size, exact)):
        reply = peer.final(correlation)
        assert reply["ok"], reply
        spec = model.manifest.io_as(ImageClassifierIO).image
        want = model.classify(frames_to_batch([frame], image=spec))[0]
        assert reply["result"][0]["label"] == want.label
        assert reply["result"][0]["score"] == pytest.approx(want.score, abs=0.05)
    assert peer.final(bad)["error"]["code"] == "bad_request"


@pytest.mark.slow  # it exports the detector in its body
def test_a_frame_to_a_detector_is_answered_with_its_detections(
    serve: Any, peer: PahoPeer, tmp_path: Path
) -> None:
    from onnx_models import yolo_like
    from PIL import Image

    from edgeinfer.export.options import ExportOptions
    from edgeinfer.export.run import export

    graph = yolo_like(tmp_path / "yolo.onnx", size=32, boxes=(32, 0, 8, 4))
    export(ExportOptions(source=str(graph), out=tmp_path / "det", task="detect",
                         quantize="none", held_count=4))  # fmt: skip
    model = edgeinfer.load(tmp_path / "det", threads=1)
    serve("porch", {"det": model})
    photo = np.random.default_rng(1).integers(0, 256, size=(48, 80, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, format="PNG")
    frame = {"format": "png", "data": buffer.getvalue()}
    sent = peer.send("porch", "det", {"id": "f1", "image": frame})
    reply = peer.final(sent)
    assert reply["ok"], reply
    (want,) = model.detect(photo)
    (got,) = reply["result"]
    assert [d["label"] for d in got["detections"]] == [d.label for d in want] and want
    boxes = [d["box"] for d in got["detections"]]
    np.testing.assert_allclose(boxes, [d.box for d in want], rtol=1e-5)


def _png(photo: np.ndarray) -> dict[str, Any]:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, format="PNG")
    return {"format": "png", "data": buffer.getvalue()}


@pytest.mark.slow  # it exports the segmenter in its body
def test_frames_to_a_segmenter_are_answered_with_run_length_masks_to_each_client(
    serve: Any, peer: PahoPeer, broker: Mosquitto, tmp_path: Path
) -> None:
    from onnx_models import yolo_seg_like

    from edgeinfer.export.options import ExportOptions
    from edgeinfer.export.run import export

    graph = yolo_seg_like(tmp_path / "seg.onnx")
    export(ExportOptions(source=str(graph), out=tmp_path / "seg", task="segment",
                         quantize="none", held_count=4))  # fmt: skip
    model = edgeinfer.load(tmp_path / "seg", threads=1)
    serve("porch", {"seg": model})
    other = PahoPeer(broker.port, "second-camera")
    try:
        rng = np.random.default_rng(2)
        photos = [rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8) for _ in range(2)]
        sent = [
            (client, client.send("porch", "seg", {"id": "m1", "image": _png(photo)}), photo)
            for client, photo in zip((peer, other), photos, strict=True)
        ]
        for client, correlation, photo in sent:
            reply = client.final(correlation)
            assert reply["ok"], reply
            (got,) = reply["result"]
            (want,) = model.segment(photo)
            assert [s["label"] for s in got["segments"]] == [s.label for s in want] and want
            for item, segment in zip(got["segments"], want, strict=True):
                counts, (h, w) = item["mask"]["counts"], item["mask"]["size"]
                runs = np.repeat(np.arange(len(counts)) % 2, counts).astype(bool)
                mask = runs.reshape(w, h).T  # COCO's column-major runs
                np.testing.assert_array_equal(mask, segment.mask)
                assert item["offset"] == list(segment.offset)
    finally:
        other.close()


# -- tensors: a stateful stream ----------------------------------------------------------------


class Counted:
    """A real raw package (exported from an ONNX file, state carried per stream by the
    runtime), counting its runs and the streams the bridge ends."""

    def __init__(self, model: edgeinfer.Model) -> None:
        self.model, self.task, self.manifest = model, model.task, model.manifest
        self.runs = 0
        self.ended: list[str] = []

    def run(self, feeds: Any, *, stream: str | None = None) -> dict[str, np.ndarray]:
        self.runs += 1
        return self.model.run(feeds, stream=stream)

    def end_stream(self, stream: str) -> None:
        self.ended.append(stream)
        self.model.end_stream(stream)


def tensor(x: list[float]) -> dict[str, Any]:
    array = np.asarray([x], np.float32)
    return {"dtype": "float32", "shape": [1, 4], "data": array.tobytes()}


def test_a_stateful_stream_keeps_its_state_per_device_stream(
    serve: Any, peer: PahoPeer, raw_package: Path
) -> None:
    model = Counted(edgeinfer.load(raw_package, threads=1))  # out = state + 2x
    serve("vad", {"vad": model})
    frames = [
        ("mic-1", [1, 0, 0, 0]),
        ("mic-2", [0, 5, 0, 0]),
        ("mic-1", [1, 1, 0, 0]),
        ("mic-1", [1, 1, 1, 0]),
        ("mic-2", [0, 5, 0, 0]),
    ]
    sent = [
        peer.send("vad", "vad", {"id": f"f{i}", "inputs": {"x": tensor(x)}, "stream": s})
        for i, (s, x) in enumerate(frames)
    ]
    replies = [peer.final(c) for c in sent]
    outs = [np.frombuffer(r["result"]["out"]["data"], np.float32).tolist() for r in replies]
    assert outs == [[2, 0, 0, 0], [0, 10, 0, 0], [4, 2, 0, 0], [6, 4, 2, 0], [0, 20, 0, 0]]
    assert [r["stream"]["new"] for r in replies] == [True, True, False, False, False]
    # A QoS 1 redelivery of a frame does not advance the state a second time.
    repeat = peer.send(
        "vad",
        "vad",
        {"id": "f3", "inputs": {"x": tensor([1, 1, 1, 0])}, "stream": "mic-1"},
        correlation=b"again",
    )
    assert peer.final(repeat)["result"] == replies[3]["result"] and model.runs == 5
    # A stateless request (no stream) is its own.
    alone = peer.final(peer.send("vad", "vad", {"id": "s", "inputs": {"x": tensor([7, 0, 0, 0])}}))
    assert np.frombuffer(alone["result"]["out"]["data"], np.float32).tolist() == [14, 0, 0, 0]


def test_streams_are_bounded_and_expire() -> None:
    clock = [0.0]
    table = StreamTable(max_streams=2, idle_s=10.0, clock_s=lambda: clock[0])
    model = SimpleNamespace(ended=[])
    model.end_stream = model.ended.append
    assert table.touch("vad", model, "a") and table.touch("vad", model, "b")
    assert not table.touch("vad", model, "a")
    assert table.touch("vad", model, "c")  # a third stream: the least recent (b) is dropped
    assert model.ended == ["b"] and len(table) == 2
    clock[0] = 11.0  # a and c idle for longer than idle_s
    assert table.touch("vad", model, "a")  # expired, so it starts afresh
    assert sorted(model.ended) == ["a", "b", "c"] and len(table) == 1


# -- generate ----------------------------------------------------------------------------------


class GatedModel:
    """The real tiny decoder; each generation pauses after its first chunk until ``gate``."""

    def __init__(self, model: edgeinfer.Model) -> None:
        self.model, self.task, self.manifest = model, model.task, model.manifest
        self.gate = threading.Event()
        self.prompts: list[Any] = []

    def stream(self, prompt: Any, **kwargs: Any) -> Iterator[Any]:
        self.prompts.append(prompt)
        for i, chunk in enumerate(self.model.stream(prompt, **kwargs)):
            yield chunk
            if i == 0:
                assert self.gate.wait(60)


def test_generation_streams_numbered_chunks_then_one_final(
    serve: Any, peer: PahoPeer, fast_decoder: Path
) -> None:
    model = edgeinfer.load(fast_decoder, threads=1)
    serve("assistant", {"tiny": model})
    full = "".join(c.text for c in model.stream("the valve", max_new_tokens=40))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    plain = peer.send(
        "assistant", "tiny", {"id": "g1", "prompt": "the valve", "max_new_tokens": 40}
    )
    stopped = peer.send(
        "assistant",
        "tiny",
        {"id": "g2", "prompt": "the valve", "max_new_tokens": 40, "stop": [stop]},
    )
    wrong = peer.send("assistant", "tiny", {"id": "g3", "text": "not a prompt"})
    for correlation, text in ((plain, full), (stopped, full[: full.index(stop)])):
        final = peer.final(correlation)
        chunks = [m for m in peer.of(correlation) if "chunk" in m]
        assert [c["chunk"] for c in chunks] == list(range(len(chunks)))
        assert "".join(c["text"] for c in chunks) == final["result"]["text"] == text
        assert final["done"] and final["result"]["chunks"] == len(chunks)
        assert final["result"]["ttft_ms"] > 0 and final["result"]["completion_tokens"] > 0
    assert peer.final(plain)["result"]["stop_reason"] in ("eos", "length")
    assert peer.final(stopped)["result"]["stop_reason"] == "stop"
    assert peer.final(wrong)["error"]["code"] == "wrong_kind"


def test_cancel_first_token_deadline_and_busy(
    serve: Any, peer: PahoPeer, fast_decoder: Path
) -> None:
    gated = GatedModel(edgeinfer.load(fast_decoder, threads=1))
    clock = FakeClock()
    bridge = serve("gen-control", {"tiny": gated}, clock_ms=clock, max_generate_queue=2)
    running = peer.send("gen-control", "tiny", {"id": "long", "prompt": "a", "max_new_tokens": 60})
    with peer._cond:
        assert peer._cond.wait_for(lambda: peer.of(running), timeout=60)  # its first chunk
    cancel = peer.final(peer.send("gen-control", "tiny", {"id": "c1", "cancel": "long"}))
    assert cancel["result"] == {"cancelled": "long", "state": "running"}
    late = peer.send(
        "gen-control", "tiny", {"id": "late", "prompt": "b", "first_token_timeout_ms": 50}
    )
    queued = peer.send("gen-control", "tiny", {"id": "next", "prompt": "c", "max_new_tokens": 8})
    busy = peer.send("gen-control", "tiny", {"id": "over", "prompt": "d"})
    assert peer.final(busy)["error"]["code"] == "busy"
    assert bridge.worker.lane("tiny").depth == 2
    clock.advance(51)  # the queued 'late' request is now past its first-token deadline
    gated.gate.set()
    assert peer.final(running)["result"]["stop_reason"] == "cancelled"
    assert peer.final(late)["error"]["code"] == "deadline_exceeded"
    assert peer.final(queued)["ok"] and peer.final(queued)["result"]["completion_tokens"] > 0
    assert gated.prompts == ["a", "c"]  # 'late' and 'over' never ran
