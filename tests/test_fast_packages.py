"""The fast lane's torch-free tiny decoder is the package ``edgeinfer export`` writes for the
tiny-decoder recipe, weights aside: the same manifest fields, the same io (input/output
names, dtypes and shapes, KV names, geometry, tokens, chat format), the same graph file and
tokenizer, the same geometry as the export reads from the torch model's config. Slow: the
reference is exported (torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fast_packages import decoder_geometry, tiny_decoder_script

from edgeinfer.manifest import Manifest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["float32", "float16"])
def pair(request: pytest.FixtureRequest, export_once: Any, package_root: Path) -> tuple[Path, Path]:
    """(the torch-free package, the exported one) with ``request.param`` KV."""
    if request.param == "float32":
        return request.getfixturevalue("fast_decoder"), request.getfixturevalue("tiny_package")
    from edgeinfer.export.options import DecoderOptions

    exported = export_once(
        package_root / "tiny-fp32-kv16",
        source="tiny-decoder",
        quantize="none",
        held_count=4,
        threads=1,
        builder=DecoderOptions(kv_dtype="float16"),
    )
    return request.getfixturevalue("fast_decoder_kv16"), exported


def test_the_manifest_has_the_exported_fields(pair: tuple[Path, Path]) -> None:
    fast, exported = (json.loads((p / "manifest.json").read_text()) for p in pair)
    assert set(fast) == set(exported)
    for field in ("schema_version", "task", "target", "precision", "quantization", "tokens"):
        assert fast[field] == exported[field], field
    assert set(fast["smoke"]) == set(exported["smoke"])
    assert fast["smoke"]["kind"] == exported["smoke"]["kind"] == "decoder"
    assert set(fast["files"]) == set(exported["files"]) - {"report.json"}


def test_the_io_is_the_exported_io(pair: tuple[Path, Path]) -> None:
    fast, exported = (Manifest.read(p).io for p in pair)
    assert fast == exported  # every field: names, dtypes, shapes, geometry, stops, chat format


def test_the_graph_and_tokenizer_are_the_exported_files(pair: tuple[Path, Path]) -> None:
    """The graph file holds the structure (its weights are external): byte for byte the
    export's; only ``model.onnx.data`` differs (numpy's weights, not torch's)."""
    fast, exported = (Manifest.read(p).files for p in pair)
    for name in ("model.onnx", "tokenizer.json"):
        assert fast[name] == exported[name], name
    assert fast["model.onnx.data"].bytes == exported["model.onnx.data"].bytes
    assert fast["model.onnx.data"].sha256 != exported["model.onnx.data"].sha256


def test_the_geometry_is_what_the_export_reads_from_the_config(tiny_source: Path) -> None:
    from edgeinfer.export.decoder.families import DecoderGeometry

    config = json.loads((tiny_source / "config.json").read_text())
    script = tiny_decoder_script()
    # the export's context: the builder's 2048 capped at the source's window
    context = min(2048, int(config["max_position_embeddings"]))
    read = DecoderGeometry.from_config(config, context_length=context)
    assert decoder_geometry(script.CONFIG, int(config["vocab_size"])) == read
