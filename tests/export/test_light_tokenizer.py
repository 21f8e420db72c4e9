"""The light tokenizer: a SentencePiece model built from a SentencePiece-family GGUF's pieces
gives the ids of the package's tokenizer.json (our llama.cpp-equal build) and decodes alike;
the export refuses one that disagrees; the runtime loads it alone, or falls back to
tokenizer.json without sentencepiece; packages without one load as before.

The GGUF is written here: a SentencePiece BPE vocabulary trained on the built-in news text,
laid out as Gemma 3's GGUF is (unknown marked control, byte pieces, user-defined runs of
spaces and newlines, control tokens of a chat format, no dummy prefix).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import PackageError
from edgeinfer.export.data.text import builtin_text
from edgeinfer.export.decoder.light_tokenizer import (
    LIGHT_TOKENIZER_NAME,
    disagreement,
    write_light_tokenizer,
)
from edgeinfer.export.decoder.lm import prepare_decoder_tokenizer
from edgeinfer.export.source import Source
from edgeinfer.manifest import Manifest, file_entries
from edgeinfer.package_io import DecoderIO, io_from_dict, io_to_dict
from edgeinfer.runtime.generate.generator import Generator
from edgeinfer.runtime.generate.lm_tokenizer import (
    JsonTokenizer,
    LMTokenizer,
    SentencePieceTokenizer,
    load_tokenizer,
)

CONTROL = ["<start_of_turn>", "<end_of_turn>"]
USER = ["\n", "\n\n", "\n\n\n", "  ", "   ", "    ", "\t"]
VOCAB_SIZE = 400  # trained pieces: under the tiny decoder's 512 ids, so its graph takes them
TEXTS = [
    "The pump pressure is rising on line 3.",
    "  leading spaces,   runs   of spaces\tand\ttabs",
    "new\nlines\n\n\nand \n mixed \n\n",
    "digits 1234567890, 3.14 and 2026-12-01",
    "non-ASCII: naïve café, Zürich, Ελληνικά, русский, 日本語",
    "emoji by bytes 🙂👍🏽🧑‍🚀 and rare ⾀ 𝔘",
    "<start_of_turn>user\nhow is the pump?<end_of_turn>\n<start_of_turn>model\n",
    "specials inside<bos>text<eos> and <unk> and <pad>",
    "▁escaped▁already",
    "",
]


def _write_gguf(path: Path) -> None:
    """A tokenizer-only ``llama`` GGUF of a BPE vocabulary trained on the news text."""
    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    trained = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(builtin_text("calibration", 200)),
        model_writer=trained,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        character_coverage=0.995,  # rare characters left to the byte pieces
        add_dummy_prefix=False,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    model = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    model.ParseFromString(trained.getvalue())
    tokens = [p.piece for p in model.pieces] + CONTROL + USER
    scores = [p.score for p in model.pieces] + [-1000.0] * (len(CONTROL) + len(USER))
    # Gemma 3's GGUF marks <unk> control (3), as its other specials
    types = [3 if p.type == 2 else p.type for p in model.pieces]
    types += [3] * len(CONTROL) + [4] * len(USER)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tokenizer.json, tokenizer.model) of the GGUF, as the export's tokenizer step writes
    them (``prepare_decoder_tokenizer``)."""
    folder = tmp_path_factory.mktemp("spm-gguf")
    _write_gguf(folder / "tok.gguf")
    source = Source(name="tok", path=folder, config={}, max_seq_len=128, gguf_file="tok.gguf")
    info = prepare_decoder_tokenizer(source, folder / "tokenizer.json")
    assert isinstance(info.sentencepiece, bytes)
    (folder / LIGHT_TOKENIZER_NAME).write_bytes(info.sentencepiece)
    return folder / "tokenizer.json", folder / LIGHT_TOKENIZER_NAME


@pytest.fixture(scope="module")
def pair(built: tuple[Path, Path]) -> tuple[JsonTokenizer, SentencePieceTokenizer]:
    return JsonTokenizer(built[0]), SentencePieceTokenizer(built[1])


def _streamed(tok: LMTokenizer, ids: list[int]) -> str:
    step = tok.decode_step()
    return "".join(piece for token in ids if (piece := step(token)) is not None)


def test_light_tokenizer_gives_the_ids_of_tokenizer_json(
    built: tuple[Path, Path], pair: tuple[JsonTokenizer, SentencePieceTokenizer]
) -> None:
    json_tok, light = pair
    assert light.special_pieces() == json_tok.special_pieces()
    assert set(CONTROL) <= set(light.special_pieces())
    for text in [*TEXTS, *builtin_text("held", 40)]:
        assert light.encode(text) == json_tok.encode(text), text
    assert disagreement(built[1], built[0], builtin_text("held", 40)) is None


def test_decode_round_trips_and_drops_special_tokens(
    pair: tuple[JsonTokenizer, SentencePieceTokenizer],
) -> None:
    json_tok, light = pair
    for text in TEXTS[:6]:
        ids = light.encode(text)
        assert light.decode(ids) == text == json_tok.decode(ids)
    ids = light.encode(TEXTS[6])
    assert light.decode(ids) == json_tok.decode(ids) == "user\nhow is the pump?\nmodel\n"


def test_streaming_steps_add_up_to_the_whole_decode(
    pair: tuple[JsonTokenizer, SentencePieceTokenizer],
) -> None:
    for tok in pair:
        for text in TEXTS:
            ids = tok.encode(text)
            assert _streamed(tok, ids) == tok.decode(ids), (type(tok).__name__, text)
    json_tok, light = pair
    rng = np.random.default_rng(0)
    compared = 0
    for _ in range(100):  # any ids (a model may emit bytes that are not UTF-8): steps alike
        ids = [int(i) for i in rng.integers(0, 420, size=12)]  # a few past the vocabulary
        try:
            expected = [step(i) for step in [json_tok.decode_step()] for i in ids]
        except Exception:  # DecodeStream's "invalid prefix": a new text dropped what it sent
            continue
        assert [step(i) for step in [light.decode_step()] for i in ids] == expected, ids
        compared += 1
    assert compared  # the seed gives sequences DecodeStream takes
    emoji = light.encode("🙂")  # four byte pieces: nothing until the character is whole
    step = light.decode_step()
    assert [step(i) for i in emoji] == [None, None, None, "🙂"]


def test_export_refuses_a_light_tokenizer_that_disagrees(
    built: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    model.ParseFromString(built[1].read_bytes())
    model.normalizer_spec.add_dummy_prefix = True  # "▁The" where tokenizer.json has "The"
    out = tmp_path / LIGHT_TOKENIZER_NAME
    with caplog.at_level(logging.WARNING):
        shipped = write_light_tokenizer(
            model.SerializeToString(), out, reference=built[0], texts=TEXTS
        )
    assert not shipped and not out.exists()
    assert "tokenizer.json alone" in caplog.text
    assert write_light_tokenizer(built[1].read_bytes(), out, reference=built[0], texts=TEXTS)
    assert out.read_bytes() == built[1].read_bytes()


def test_an_unreadable_light_tokenizer_is_a_package_error(tmp_path: Path) -> None:
    bad = tmp_path / LIGHT_TOKENIZER_NAME
    bad.write_bytes(b"not a model")
    with pytest.raises(PackageError, match="re-export"):
        SentencePieceTokenizer(bad)


def test_a_decoder_io_without_a_light_tokenizer_still_loads() -> None:
    old = {
        "kind": "decoder",
        "graph": "model.onnx",
        "tokenizer": "tokenizer.json",
        "inputs": [],
        "outputs": [],
        "max_seq_len": 8,
        "num_layers": 1,
        "num_kv_heads": 1,
        "head_dim": 4,
        "vocab_size": 10,
        "context_length": 8,
        "source_context_length": 8,
        "kv_layout": "shared-buffer",
        "past_names": [],
        "present_names": [],
        "stop_token_ids": [0],
    }
    parsed = io_from_dict(old)
    assert isinstance(parsed, DecoderIO) and parsed.light_tokenizer is None
    assert io_from_dict(io_to_dict(parsed)) == parsed


def _with_light_tokenizer(package: Path, built: tuple[Path, Path], out: Path) -> Path:
    """A copy of ``package`` with the test GGUF's two tokenizers (ids under its vocabulary)."""
    shutil.copytree(package, out)
    shutil.copy(built[0], out / "tokenizer.json")
    shutil.copy(built[1], out / LIGHT_TOKENIZER_NAME)
    manifest = Manifest.read(out)
    io = dataclasses.replace(manifest.io_as(DecoderIO), light_tokenizer=LIGHT_TOKENIZER_NAME)
    files = file_entries(out, [*manifest.files, LIGHT_TOKENIZER_NAME])
    dataclasses.replace(manifest, io=io, files=files).write(out)
    Manifest.read(out).verify(out)
    return out


def test_generator_loads_the_light_tokenizer_alone_or_falls_back(
    tiny_package: Path,
    built: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    package = _with_light_tokenizer(tiny_package, built, tmp_path / "light")
    manifest = Manifest.read(package)
    config = RuntimeConfig(threads=1)
    light = Generator(package, manifest, config=config, context_length=64)
    assert isinstance(light._tok, SentencePieceTokenizer)
    expected = light.generate("The pump pressure", max_new_tokens=12)

    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # not installed
    with caplog.at_level(logging.INFO):
        fallback = Generator(package, manifest, config=config, context_length=64)
    assert isinstance(fallback._tok, JsonTokenizer)
    assert "edgeinfer[light-tokenizer]" in caplog.text
    got = fallback.generate("The pump pressure", max_new_tokens=12)
    assert (got.token_ids, got.text, got.prompt_tokens) == (
        expected.token_ids,
        expected.text,
        expected.prompt_tokens,
    )
    # random weights emit byte pieces that are not UTF-8: streamed as tokenizers streams them
    streamed = [list(g.stream("The pump pressure", max_new_tokens=12)) for g in (light, fallback)]
    assert streamed[0] == streamed[1]
    old_io = Manifest.read(tiny_package).io_as(DecoderIO)
    assert old_io.light_tokenizer is None
    assert isinstance(load_tokenizer(tiny_package, old_io), JsonTokenizer)


GEMMA_TURNS = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _tiny_folder(out: Path, built: tuple[Path, Path] | None) -> Path:
    """The tiny decoder's model folder with a ``tokenizer.model`` beside its tokenizer.json:
    with ``built``, the test GGUF's pair (they agree), else the GGUF's model beside the tiny
    decoder's own byte-level tokenizer.json (they disagree)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from build_tiny_decoder import build

    sys.path.pop(0)
    folder = Path(build(out))
    if built is not None:
        shutil.copy(built[0], folder / "tokenizer.json")
        tokens = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
        config = {**tokens, "unk_token": "<unk>", "chat_template": GEMMA_TURNS}
        (folder / "tokenizer_config.json").write_text(
            json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"})
        )
    return folder


@pytest.mark.slow
def test_export_ships_a_light_tokenizer_only_when_it_agrees(
    built: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from edgeinfer.export.options import ExportOptions
    from edgeinfer.export.run import export

    for agrees in (True, False):
        folder = _tiny_folder(tmp_path / f"src-{agrees}", built if agrees else None)
        shutil.copy(built[1], folder / LIGHT_TOKENIZER_NAME)
        out = tmp_path / f"pkg-{agrees}"
        with caplog.at_level(logging.WARNING):
            export(ExportOptions(source=str(folder), out=out, quantize="none", held_count=4))
        manifest = Manifest.read(out)
        manifest.verify(out)
        io = manifest.io_as(DecoderIO)
        assert (io.light_tokenizer == LIGHT_TOKENIZER_NAME) is agrees
        assert (LIGHT_TOKENIZER_NAME in manifest.files) is agrees
        assert (out / LIGHT_TOKENIZER_NAME).exists() is agrees
        assert ("tokenizer.json alone" in caplog.text) is not agrees
        tok = load_tokenizer(out, io)
        assert isinstance(tok, SentencePieceTokenizer if agrees else JsonTokenizer)
        caplog.clear()
