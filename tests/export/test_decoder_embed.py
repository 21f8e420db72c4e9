"""The int8 embedding (``GatherBlockQuantized``): it gathers exactly the dequantized table, and
a tied 8-bit head lends it its bytes (no second copy of the table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edgeinfer.export.decoder.embed import quantize_embedding
from edgeinfer.export.decoder.lm import full_logits
from edgeinfer.export.passes import quantize
from edgeinfer.manifest import Manifest

TABLE = "model.embed_tokens.weight"


def _with_table(graph: Path, table: np.ndarray, out: Path) -> Path:
    """``graph`` with its float32 embedding table replaced by ``table``."""
    model = onnx.load(str(graph))
    for init in model.graph.initializer:
        if init.name == TABLE:
            init.CopyFrom(numpy_helper.from_array(table.astype(np.float32), TABLE))
    onnx.save(model, str(out))
    return out


@pytest.mark.parametrize("head", ["int8-tied", "fp32"])
def test_int8_embedding_gathers_the_dequantized_table(
    tiny_package: Path, tmp_path: Path, head: str
) -> None:
    io = Manifest.read(tiny_package).io
    fp32 = tiny_package / io.graph
    body = tmp_path / "body.onnx"
    exclude = [] if head == "int8-tied" else ["/lm_head/MatMul"]
    quantize.quantize_weight_only(fp32, body, bits=8, exclude=exclude)
    embedded = tmp_path / "embed.onnx"
    quantize_embedding(body, embedded)

    model = onnx.load(str(embedded))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    (node,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    assert TABLE not in inits and not any(n.name == "/embed/Gather" for n in model.graph.node)
    vocab, hidden = numpy_helper.to_array(
        next(i for i in onnx.load(str(fp32)).graph.initializer if i.name == TABLE)
    ).shape
    if head == "int8-tied":  # the head's own initializers: no new table
        assert list(node.input[0:1]) == ["lm_head.weight_Q8"]
        assert not any(name.startswith(TABLE) for name in inits)
    data = inits[node.input[0]].astype(np.float32).reshape(vocab, hidden // 32, 32)
    scales = inits[node.input[2] if head == "fp32" else "lm_head.weight_scales"]
    table = ((data - 128) * scales.reshape(vocab, hidden // 32, 1)).reshape(vocab, hidden)
    reference = _with_table(body, table, tmp_path / "reference.onnx")

    ids = list(range(3, 40))
    got = full_logits(ort.InferenceSession(str(embedded)), io, ids)
    want = full_logits(ort.InferenceSession(str(reference)), io, ids)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert embedded.stat().st_size < body.stat().st_size - vocab * hidden * 2  # >= 2 B/weight
