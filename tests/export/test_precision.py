"""Honest precision: the share of multiply-accumulates that run in int8, in the manifest and the
report; a dynamic int8 of a convolutional network (its head alone quantized) is "mixed", not
int8, and static int8 is tried beside it; the faster passing variant ships."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from onnx_models import tiny_cnn

from edgeinfer.export.onnx_file.macs import mac_share
from edgeinfer.export.options import ExportOptions

pytestmark = pytest.mark.slow  # torch exports the graph; the second test runs an export

# tiny_cnn at 32 x 32: conv 3->8 3x3 stride 2 -> [1, 8, 16, 16], conv 8->16 3x3 stride 2 ->
# [1, 16, 8, 8], then a 16 -> 3 head.
CONV_MACS = 8 * 16 * 16 * 3 * 9 + 16 * 8 * 8 * 8 * 9
HEAD_MACS = 16 * 3


def test_the_macs_of_a_graph_are_counted_by_hand(tmp_path: Path) -> None:
    share = mac_share(tiny_cnn(tmp_path / "cnn.onnx"))
    assert (share.total, share.int8, share.share) == (CONV_MACS + HEAD_MACS, 0, 0.0)


def test_a_dynamic_int8_of_a_cnn_is_mixed_and_static_int8_is_tried(tmp_path: Path) -> None:
    from edgeinfer.export.run import export

    graph = tiny_cnn(tmp_path / "cnn.onnx")
    out = tmp_path / "pkg"
    report = export(ExportOptions(source=str(graph), out=out, task="classify", quantize="int8",
                                  held_count=16, keep_best=True))  # fmt: skip
    variants = report.variants
    dynamic, static = variants["int8"], variants["int8-static"]
    assert dynamic["precision"] == "mixed" and static["precision"] == "int8"
    assert dynamic["quantization"]["int8_macs"] == HEAD_MACS
    # the first convolution stays fp32 on AVX2 (its float input: ort_compat.float_input_nodes)
    first_conv = 8 * 16 * 16 * 3 * 9
    assert static["quantization"]["int8_macs"] == CONV_MACS + HEAD_MACS - first_conv
    assert any("labelled mixed, not int8" in w for w in report.warnings)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == variants[report.chosen or ""]["precision"]
    assert "int8_mac_share" in manifest["quantization"] or manifest["precision"] == "fp32"
