"""Every common encoder family, as a tiny random model from its config: the packaged tokenizer
gives transformers' ids (tokenizer_config settings baked in), and each exports — parity with
PyTorch, the gate, a package that loads and answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from families import FAMILIES, LONG, TEXTS, build, build_vit
from tokenizers import Tokenizer

import edgeinfer
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.passes.convert import prepare_tokenizer
from edgeinfer.export.run import export
from edgeinfer.export.source import resolve_source

# A classifier without id2label names (LABEL_i) for two families, embedders for the rest.
CLASSIFIERS = {"distilbert": 3, "roberta": 2}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: build(f, root / f, labels=CLASSIFIERS.get(f)) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_packaged_tokenizer_gives_transformers_ids(
    family: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    source = resolve_source(str(sources[family]))
    assert source.max_seq_len == 64  # RoBERTa's 66 positions hold 64 tokens
    prepare_tokenizer(source, tmp_path / "tokenizer.json")
    device = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    device.enable_truncation(source.max_seq_len)  # as the runtime does
    reference = AutoTokenizer.from_pretrained(str(sources[family]))
    for text in [*TEXTS[:10], LONG]:
        want = reference(text, truncation=True, max_length=source.max_seq_len)["input_ids"]
        assert device.encode(text).ids == want, (family, text)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_exports_gates_loads_and_runs(
    family: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "pkg"
    task = "classify" if family in CLASSIFIERS else "embed"
    report = export(
        ExportOptions(
            source=str(sources[family]),
            out=out,
            task=task,
            quantize="int8",
            held_count=16,
            threads=1,
            force_quantize=True,  # the speed guard is measured in benchmarks/, not here
        )
    )
    assert report.chosen == "int8"
    assert report.variants["fp32"]["accuracy"]["passed"]  # parity with PyTorch
    assert report.variants["int8"]["accuracy"]["passed"]
    with edgeinfer.load(out) as model:
        if task == "classify":
            labels = [f"LABEL_{i}" for i in range(CLASSIFIERS[family])]
            assert list(model.manifest.io.labels) == labels  # type: ignore[union-attr]
            results = model.classify([TEXTS[0], LONG])
            assert all(r.label in labels for r in results)
        else:
            vectors = model.embed([TEXTS[0], LONG])
            assert vectors.shape == (2, 32)


@pytest.mark.slow
def test_a_vit_folder_exports_with_its_preprocessing(tmp_path: Path) -> None:
    folder = build_vit(tmp_path / "vit")
    out = tmp_path / "pkg"
    report = export(
        ExportOptions(
            source=str(folder), out=out, quantize="int8-static", held_count=24, threads=1,
            force_quantize=True,
        )
    )  # fmt: skip
    assert report.builder == "vision" and report.task == "classify"
    assert report.variants["fp32"]["accuracy"]["passed"]
    manifest = json.loads((out / "manifest.json").read_text())
    image = manifest["io"]["image"]
    assert (image["height"], image["resize"], image["mean"]) == (32, "stretch", [127.5] * 3)
    assert manifest["io"]["labels"] == ["LABEL_0", "LABEL_1", "LABEL_2"]
    from sklearn.datasets import load_sample_images

    photo = load_sample_images().images[0]  # [427, 640, 3]: resized by the runtime
    with edgeinfer.load(out) as model:
        assert model.classify(photo)[0].label in manifest["io"]["labels"]
