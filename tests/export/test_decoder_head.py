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
from edgeinfer.errors import ConversionError
from edgeinfer.export import package
from edgeinfer.export.decoder.head import refine_head, split_head
from edgeinfer.export.decoder.lm import full_logits
from edgeinfer.export.decoder.variants import VARIANTS
from edgeinfer.export.passes import quantize
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.decoding import Decoder

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


def test_wide_one_token_steps_and_verification_compute_the_same_bits(int8_folder: Path) -> None:
    manifest, config = Manifest.read(int8_folder), RuntimeConfig(threads=2)
    text = Generator(int8_folder, manifest, config=config, context_length=96)
    ids = text.encode("Chelsea won the cup after a long season of")
    text.close()
    gen = Decoder(int8_folder, manifest, config=config, context_length=96)
    tokens = list(gen.tokens(ids, max_new_tokens=12, sampling=SamplingConfig(draft_tokens=0)))
    steps = [gen.prefill(ids).copy()]
    for position, token in enumerate(tokens[:-1], start=len(ids)):
        steps.append(gen.decode_one_token(token, position, wide=True).copy())
    gen.forget_prefix()
    gen.prefill(ids)
    rows = gen._forward(tokens[:-1], len(ids), len(tokens) - 1, "logits")  # one pass
    for row, step in zip(rows, steps[1:], strict=True):
        assert np.array_equal(row, step)  # bit for bit, not merely close


def test_a_split_head_gives_the_whole_heads_logits(tiny_package: Path, tmp_path: Path) -> None:
    io = Manifest.read(tiny_package).io
    whole, split = tmp_path / "whole.onnx", tmp_path / "split.onnx"
    quantize.quantize_weight_only(tiny_package / "model.onnx", whole, bits=4)
    split_head(whole, split, max_bytes=1024)  # the tiny head in several pieces
    model = onnx.load(str(split))
    pieces = [n for n in model.graph.node if n.name.startswith("/lm_head/")]
    assert [n.op_type for n in pieces].count("MatMulNBits") > 2
    assert sum(n.op_type == "MatMulNBits" for n in pieces) == sum(
        n.op_type == "MatMulNBits" and n.name.startswith("/lm_head/") for n in model.graph.node
    )
    got = full_logits(ort.InferenceSession(str(split)), io, IDS)
    want = full_logits(ort.InferenceSession(str(whole)), io, IDS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert (got.argmax(1) == want.argmax(1)).all()


def test_a_tied_8_bit_head_is_not_split(int8_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="read by other nodes"):
        split_head(int8_folder / "model.onnx", tmp_path / "split.onnx", max_bytes=1024)


def test_the_4_bit_ranking_head_refines_from_the_8_bit_table(
    tiny_package: Path, tmp_path: Path
) -> None:
    io = Manifest.read(tiny_package).io
    graph = tmp_path / "rank4.onnx"
    VARIANTS["int8-weight-only-int8-embed-rank4-refined"].build(tiny_package / "model.onnx", graph)
    model = onnx.load(str(graph))
    head = [n for n in model.graph.node if n.name.startswith("/lm_head/MatMul")]
    assert {dict((a.name, a.i) for a in n.attribute)["bits"] for n in head} == {4}
    gathers = {n.input[0] for n in model.graph.node if n.op_type == "GatherBlockQuantized"}
    assert len(gathers) == 1  # the embedding and the refinement read one 8-bit table
    # The default variant refines from the head's own 8-bit blocks, this one from the table
    # quantized on its own: the same values up to rounding, so the same best token except at
    # the random tiny model's near-ties.
    default = tmp_path / "default.onnx"
    VARIANTS["int8-weight-only-int8-embed-refined"].build(tiny_package / "model.onnx", default)
    got = full_logits(ort.InferenceSession(str(graph)), io, IDS)
    want = full_logits(ort.InferenceSession(str(default)), io, IDS)
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9


def test_a_ranking_copy_is_skipped_for_an_untied_head(tiny_package: Path, tmp_path: Path) -> None:
    rank4 = VARIANTS["int8-weight-only-int8-embed-rank4-refined"]
    assert rank4.unsuitable is not None
    assert rank4.unsuitable(tiny_package / "model.onnx") is None  # the tiny model is tied
    model = onnx.load(str(tiny_package / "model.onnx"))
    head = next(n for n in model.graph.node if n.name == "/lm_head/MatMul")
    weight = next(i for i in model.graph.initializer if i.name == head.input[1])
    untied = onnx.numpy_helper.to_array(weight) * 1.5
    weight.CopyFrom(onnx.numpy_helper.from_array(untied, weight.name))
    onnx.save(model, str(tmp_path / "untied.onnx"))
    assert "not tied" in (rank4.unsuitable(tmp_path / "untied.onnx") or "")
