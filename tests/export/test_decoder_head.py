"""The 8-bit decoder graph on the tiny model: the refined head's best logits are the fp32-
activation ones, and a one-token step computes the same bits as a many-token verification (so
prompt lookup cannot change a greedy answer)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeinfer.config import RuntimeConfig, SamplingConfig
from edgeinfer.export import package
from edgeinfer.export.decoder.head import refine_head
from edgeinfer.export.decoder.lm import full_logits
from edgeinfer.export.decoder.variants import VARIANTS
from edgeinfer.export.passes import quantize
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

IDS = list(range(3, 40))


@pytest.fixture(scope="module")
def int8_folder(tiny_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny decoder as the default int8 variant builds it (a package folder; the tiny
    random model is no gate's business)."""
    work = tmp_path_factory.mktemp("int8")
    graph = work / "int8.onnx"
    VARIANTS["int8-weight-only-int8-embed-refined"].build(tiny_package / "model.onnx", graph)
    folder = work / "package"
    package.externalize(graph, folder)
    for name in ("manifest.json", "tokenizer.json"):
        shutil.copy(tiny_package / name, folder / name)
    return folder


def test_every_weight_is_stored_once_in_8_bits(int8_folder: Path) -> None:
    model = onnx.load(str(int8_folder / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert "MatMul" not in [
        n.op_type for n in model.graph.node if not n.name.startswith("/lm_head/refine/")
    ]
    head = next(
        n for n in model.graph.node if n.name.startswith("/lm_head/") and n.op_type == "MatMulNBits"
    )
    gathers = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    assert ops.count("MatMulNBits") == 2 * 5 + 1  # 2 layers x 5 projections + the head
    assert {g.input[0] for g in gathers} == {head.input[1]}  # embedding and refinement: the head's
    names = {i.name for i in model.graph.initializer}
    assert "model.embed_tokens.weight" not in names and "lm_head.weight" not in names


def test_refined_head_gives_fp32_activation_logits_for_the_best_tokens(
    tiny_package: Path, tmp_path: Path
) -> None:
    io = Manifest.read(tiny_package).io
    fp32 = tiny_package / "model.onnx"
    level4, exact = tmp_path / "level4.onnx", tmp_path / "exact.onnx"
    quantize.quantize_weight_only(fp32, level4, bits=8)
    # The same 8-bit weights with fp32 activations in the head (accuracy level 1).
    body = tmp_path / "body.onnx"
    quantize.quantize_weight_only(fp32, body, bits=8, exclude=["/lm_head/MatMul"])
    quantize.quantize_weight_only(body, exact, bits=8, accuracy_level=1)
    refined = tmp_path / "refined.onnx"
    refine_head(level4, refined, tokens=16)
    got = full_logits(ort.InferenceSession(str(refined)), io, IDS)  # [S, V]
    want = full_logits(ort.InferenceSession(str(exact)), io, IDS)
    rough = full_logits(ort.InferenceSession(str(level4)), io, IDS)
    top = np.argsort(-rough, axis=1)[:, :16]  # the tokens the refinement recomputed
    np.testing.assert_allclose(
        np.take_along_axis(got, top, 1), np.take_along_axis(want, top, 1), atol=1e-4
    )
    assert (got.argmax(1) == want.argmax(1)).all()


def test_one_token_steps_and_verification_compute_the_same_bits(int8_folder: Path) -> None:
    gen = Generator(
        int8_folder, Manifest.read(int8_folder), config=RuntimeConfig(threads=2), context_length=96
    )
    ids = gen.encode("Chelsea won the cup after a long season of")
    tokens = list(gen.tokens(ids, max_new_tokens=12, sampling=SamplingConfig(draft_tokens=0)))
    steps = [gen.prefill(ids).copy()]
    for position, token in enumerate(tokens[:-1], start=len(ids)):
        steps.append(gen.decode_one_token(token, position).copy())
    gen.forget_prefix()
    gen.prefill(ids)
    rows = gen._forward(tokens[:-1], len(ids), len(tokens) - 1, "logits")  # one pass
    for row, step in zip(rows, steps[1:], strict=True):
        assert np.array_equal(row, step)  # bit for bit, not merely close
