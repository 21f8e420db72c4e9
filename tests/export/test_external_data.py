"""Decoders over protobuf's 2 GiB (a 0.5B+ model in fp32, its tied head a second copy of the
table) keep their weights in a file beside the graph: exported, quantized, packaged and loaded
like any other. The threshold is lowered so that the tiny model takes that path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config import RuntimeConfig
from edgeinfer.export import package
from edgeinfer.export.decoder.embed import quantize_embedding
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.passes import quantize
from edgeinfer.export.run import export
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate.decoding import Decoder


def test_a_graph_with_external_weights_exports_quantizes_and_generates(
    tiny_source: Path, tiny_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(package, "EXTERNAL_DATA_BYTES", 0)
    out = tmp_path / "external"
    export(
        ExportOptions(source=str(tiny_source), out=out, quantize="none", held_count=2, threads=1)
    )
    manifest = Manifest.read(out)
    weights = package.external_data_files(out / manifest.io.graph)
    assert weights and set(weights) <= set(manifest.files)  # hashed like every file
    assert (out / manifest.io.graph).stat().st_size < (out / weights[0]).stat().st_size

    config = RuntimeConfig(threads=1)
    ids = [5, 17, 42, 99, 7]
    split = Decoder(out, manifest, config=config, context_length=32)
    whole = Decoder(tiny_package, Manifest.read(tiny_package), config=config, context_length=32)
    np.testing.assert_allclose(split.prefill(ids), whole.prefill(ids), rtol=1e-5, atol=1e-5)

    int8 = tmp_path / "int8.onnx"
    quantize.quantize_weight_only(out / manifest.io.graph, int8, bits=8)
    quantize_embedding(int8, tmp_path / "int8-embed.onnx")
    assert package.external_data_files(tmp_path / "int8-embed.onnx")
