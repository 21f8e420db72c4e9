"""Students in an export (``--distill-layers``, ``--prune-*``) on a tiny random BERT built from
a config here: layers chosen, heads and neurons pruned, trained to match the teacher, gated
against the teacher in fp32, and every candidate in the report's Pareto table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.cli import main
from edgeinfer.export.data import domains
from edgeinfer.export.data.domains import broad_training_text
from edgeinfer.export.data.text import builtin_text, training_text
from edgeinfer.export.encoder.students import distill, pareto, prune
from edgeinfer.export.recipes import find
from edgeinfer.manifest import Manifest

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer BERT (hidden 32, 4 heads, FFN 64) with random weights (seed 0) and the
    MiniLM tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    recipe = find("minilm")
    assert recipe is not None
    vocab = recipe.locate()
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(str(folder))
    for name in _TOKENIZER_FILES:
        shutil.copy2(vocab / name, folder / name)
    return folder


def test_students_refuse_what_they_cannot_build(tmp_path: Path) -> None:
    from edgeinfer.errors import ConfigError
    from edgeinfer.export.options import ShrinkOptions

    for bad in ({}, {"layers": (0,)}, {"layers": (2, 2)}, {"prune_heads": 1.0}):
        with pytest.raises(ConfigError):
            ShrinkOptions(**bad)  # type: ignore[arg-type]
    out = str(tmp_path / "out")
    assert main(["export", "minilm", "-o", out, "--distill-layers", "four"]) == 2
    assert main(["export", "minilm", "-o", out, "--distill-layers", "4", "--early-exit"]) == 2
    assert main(["export", "minilm", "-o", out, "--distill-epochs", "2"]) == 2


def test_pareto_front() -> None:
    points = [(1.0, 0.90), (2.0, 0.95), (2.5, 0.94), (3.0, 0.99), (1.0, 0.89)]
    assert pareto.front(points) == [True, True, False, True, False]


def test_pruning_keeps_the_most_important_units(tiny_bert: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    teacher = distill.load_teacher(tiny_bert, "embed")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))  # type: ignore[no-untyped-call]
    batches = distill.make_batches(tokenizer, training_text(24), seq_len=32, batch_tokens=256)
    assert all(b.input_ids.numel() <= 256 for b in batches)
    heads, ffn = prune.importance(teacher, batches)
    assert heads.shape == (4, 4) and ffn.shape == (4, 64) and bool((heads > 0).all())
    student = distill.keep_layers(teacher, [0, 1, 3])
    left = prune.prune(
        student, prune.importance(student, batches), heads_fraction=0.5, ffn_fraction=0.25
    )
    assert left == {"heads": 2, "ffn": 48}
    layer = distill.encoder_layers(student)[0]
    assert layer.intermediate.dense.out_features == 48
    assert layer.attention.self.num_attention_heads == 2
    distill.teacher_targets(teacher, batches, "embed", [0, 1, 3])
    before = sum(distill._loss(student, b, "embed").item() for b in batches)
    config = distill.TrainConfig(epochs=2, learning_rate=1e-3, batch_tokens=256, seed=0)
    losses = distill.train(student, batches, "embed", config)
    assert losses[-1] < before / len(batches)
    with torch.no_grad():
        out = distill.outputs(student, batches[0], "embed")[1]
    assert out.shape == (batches[0].input_ids.shape[0], 32)


def _export_student(
    tiny_bert: Path, folder: Path, max_accuracy_loss: float, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    """A 2-layer, half-FFN student of ``tiny_bert`` trained on 160 news texts and gated with
    ``max_accuracy_loss`` on 24 held news texts and the held-out technical text: the exit
    code and the --json report."""
    folder.mkdir(parents=True, exist_ok=True)
    train = folder / "train.txt"
    train.write_text("\n".join(training_text(160)) + "\n")
    held = folder / "held.txt"
    held.write_text("\n".join(builtin_text("held", 24)) + "\n")
    argv = [
        "export", str(tiny_bert), "-o", str(folder / "student"), "--task", "embed",
        "--quantize", "int8", "--distill-layers", "2", "--prune-ffn", "0.5",
        "--distill-epochs", "2", "--train-data", str(train), "--eval-data", str(held),
        "--max-accuracy-loss", str(max_accuracy_loss), "--force-quantize", "--threads", "2",
        "--json",
    ]  # fmt: skip
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_default_training_text_mixes_domains_and_holds_one_out() -> None:
    train = broad_training_text(3000)
    technical = domains.technical_text("choice", 400) + domains.technical_text("report", 400)
    assert set(domains.dialogue_texts()) & set(train) and set(training_text(3000)) & set(train)
    assert not set(train) & set(technical)
    assert not set(train) & set(builtin_text("held", 400))
    assert not set(domains.technical_text("choice", 400)) & set(
        domains.technical_text("report", 400)
    )
    assert domains.HELD_OUT not in domains.TRAIN_DOMAINS


@pytest.mark.slow
def test_export_distills_a_student_and_reports_every_candidate(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "student"
    code, report = _export_student(tiny_bert, tmp_path, 0.5, capsys)
    assert code == 0
    names = {row["name"] for row in report["pareto"]}
    assert names == {"fp32", "int8", "student-2L-fp32", "student-2L-int8"}
    assert report["chosen"].startswith("student-2L")
    student = report["variants"]["student-2L-fp32"]["student"]
    assert student["layers"] == 2 and student["ffn"] == 32 and student["texts"] == 160
    assert len(student["teacher_layers"]) == 2 and len(student["losses"]) == 2
    manifest = Manifest.read(out)
    manifest.verify(out)
    assert "pareto.png" in manifest.files
    assert manifest.accuracy["reference"] == "pytorch-fp32"
    assert manifest.accuracy["off_domain_data"] == f"builtin:{domains.HELD_OUT}"
    for name, variant in report["variants"].items():
        if "precision" not in variant or name.endswith("onnx-fp32"):
            continue  # the fp32 graph's parity with its own PyTorch model: one text
        accuracy = variant["accuracy"]
        both = (accuracy["in_domain"], accuracy["off_domain"])
        assert accuracy["passed"] == all(text["passed"] for text in both)
        assert accuracy["mean"] == min(text["mean"] for text in both)
        assert "passed" not in accuracy["off_domain_report"]  # reported, never gated
    for row in report["pareto"]:
        assert {"mean", "min"} <= set(row["in_domain"]) and {"mean", "min"} <= set(
            row["off_domain"]
        )


@pytest.mark.slow
def test_the_off_domain_gate_refuses_a_student_that_only_knows_its_domain(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same seeded student twice: first gated loosely to read its two numbers, then with a
    # budget its in-domain text meets and its off-domain text does not.
    code, report = _export_student(tiny_bert, tmp_path / "loose", 0.5, capsys)
    assert code == 0
    accuracy = report["variants"]["student-2L-fp32"]["accuracy"]
    news, technical = accuracy["in_domain"], accuracy["off_domain"]
    assert technical["mean"] < news["mean"]  # trained on news: weaker on technical prose
    budget = (1 - news["mean"] + 1 - technical["mean"]) / 2  # between the two texts' losses
    code, report = _export_student(tiny_bert, tmp_path / "strict", budget, capsys)
    accuracy = report["variants"]["student-2L-fp32"]["accuracy"]
    assert accuracy["off_domain"]["mean"] == technical["mean"]  # the same student
    assert accuracy["in_domain"]["passed"]
    assert not accuracy["off_domain"]["passed"] and not accuracy["passed"]
    refused = {
        name
        for name, variant in report["variants"].items()
        if "off_domain" in variant.get("accuracy", {})
        and not variant["accuracy"]["off_domain"]["passed"]
    }
    assert all(not report["variants"][name]["accuracy"]["passed"] for name in refused)
    assert report["chosen"] not in refused


@pytest.mark.slow
def test_a_classifier_student_matches_the_teachers_labels(tiny_bert: Path, tmp_path: Path) -> None:
    import torch
    from transformers import BertForSequenceClassification

    from edgeinfer.export.options import ExportOptions, ShrinkOptions
    from edgeinfer.export.run import export

    folder = tmp_path / "tiny-classifier"
    torch.manual_seed(1)
    labels = {0: "business", 1: "sport", 2: "tech"}
    config = distill.load_teacher(tiny_bert, "embed").config
    config.id2label, config.label2id = labels, {v: k for k, v in labels.items()}
    BertForSequenceClassification(config).eval().save_pretrained(str(folder))
    for name in _TOKENIZER_FILES:
        shutil.copy2(tiny_bert / name, folder / name)
    options = ExportOptions(
        source=str(folder),
        out=tmp_path / "classifier",
        task="classify",
        quantize="none",
        held_count=24,
        max_accuracy_loss=0.5,
        threads=2,
        builder=ShrinkOptions(layers=(2,), train_count=120, epochs=2),
    )
    report = export(options)
    assert report.chosen == "student-2L-fp32"
    student = report.variants["student-2L-fp32"]
    assert student["accuracy"]["metric"] == "label_agreement"
    assert student["student"]["layers"] == 2
    assert Manifest.read(tmp_path / "classifier").io.labels == ("business", "sport", "tech")
