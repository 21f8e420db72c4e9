"""`edgeinfer export` end to end on the real MiniLM model: gates, the speed guard's wiring,
atomicity, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.cli import main
from edgeinfer.errors import SlowerQuantizationError
from edgeinfer.export.data.text import builtin_text, read_text_file
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.run import export
from edgeinfer.export.source import resolve_source

pytestmark = pytest.mark.slow


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeinfer", *args], capture_output=True, text=True, timeout=600
    )


def test_report_of_the_int8_export(minilm_int8: Path) -> None:
    report = json.loads((minilm_int8 / "report.json").read_text())
    assert report["chosen"] == "int8"
    names = [s["name"] for s in report["stages"]]
    # report.json is written inside the package stage, so it lists the stages before it.
    assert names == ["convert", "reference", "parity", "optimize", "quantize", "gate"]
    assert report["variants"]["onnx-fp32"]["accuracy"]["min"] >= 0.9999  # lossless conversion
    assert report["variants"]["fp32"]["fused_ops"]["Attention"] == 6
    int8 = report["variants"]["int8"]
    assert int8["accuracy"]["passed"] and int8["speed"]["pairs"] >= 2
    low, high = int8["speed"]["interval"]
    assert low <= int8["speed"]["speedup_vs_fp32"] <= high
    assert report["builder"] == "encoder"


def test_impossible_gate_fails_with_exit_1_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    result = _cli(
        "export",
        "minilm",
        "-o",
        str(out),
        "--max-accuracy-loss",
        "0",
        "--eval-data",
        str(_held_file(tmp_path)),
    )
    assert result.returncode == 1, result.stderr
    assert "accuracy_gate" in result.stderr
    assert not out.exists() and not (tmp_path / "pkg.partial").exists()


def test_keep_best_ships_the_variant_that_passes(tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    result = _cli(
        "export",
        "minilm",
        "-o",
        str(out),
        "--max-accuracy-loss",
        "0.000001",
        "--keep-best",
        "--eval-data",
        str(_held_file(tmp_path)),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["chosen"] == "fp32" and "keep-best kept fp32" in report["warnings"][0]
    assert edgeinfer.Manifest.read(out).precision == "fp32"


def test_interrupted_export_leaves_nothing_at_out(tmp_path: Path) -> None:
    """Killed at the worst moment — the package fully staged, not yet renamed into place —
    the export leaves nothing at OUT; the next export cleans the staging folder up."""
    out = tmp_path / "pkg"
    killed_at_rename = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from edgeinfer.export import package\n"
        "from edgeinfer.export.options import ExportOptions\n"
        "from edgeinfer.export.run import export\n"
        "package.commit = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "export(ExportOptions(source='minilm', out=Path(sys.argv[1]), quantize='none',"
        " eval_data=Path(sys.argv[2])))\n"
    )
    held = _held_file(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", killed_at_rename, str(out), str(held)], capture_output=True
    )
    assert proc.returncode == -9, proc.stderr
    assert not out.exists()
    assert (tmp_path / "pkg.partial" / "manifest.json").is_file()  # killed after staging
    result = _cli(
        "export", "minilm", "-o", str(out), "--quantize", "none", "--eval-data", str(held)
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "pkg.partial").exists()
    edgeinfer.Manifest.read(out).verify(out)


def test_existing_output_is_kept_unless_overwrite(minilm_int8: Path, tmp_path: Path) -> None:
    result = _cli("export", "minilm", "-o", str(minilm_int8))
    assert result.returncode == 2 and "--overwrite" in result.stderr


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("sentence-transformers/all-MiniLM-L6-v2", "never downloads"),
        ("./no/such/folder", "does not exist"),
    ],
)
def test_bad_sources_are_usage_errors(source: str, message: str, tmp_path: Path) -> None:
    result = _cli("export", source, "-o", str(tmp_path / "pkg"))
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split())


def test_corrupt_weights_are_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    src = resolve_source("minilm").path
    folder.mkdir()
    for name in (
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        (folder / name).write_bytes((src / name).read_bytes())
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    result = _cli("export", str(folder), "-o", str(tmp_path / "pkg"))
    assert result.returncode == 2
    assert "conversion" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_unknown_task_and_target_are_usage_errors(tmp_path: Path) -> None:
    assert main(["export", "minilm", "-o", str(tmp_path / "a"), "--task", "dance"]) == 2
    assert main(["export", "minilm", "-o", str(tmp_path / "a"), "--target", "abacus"]) == 2
    assert main(["export", "minilm", "-o", str(tmp_path / "a"), "--max-accuracy-loss", "-1"]) == 2


def test_classifier_export_matches_pytorch(tmp_path: Path) -> None:
    """A classification head on the MiniLM backbone (untrained head: this checks the
    export and runtime path, parity and label order, not a task's accuracy)."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    src = resolve_source("minilm").path
    folder = tmp_path / "clf"
    torch.manual_seed(0)
    labels = {0: "business", 1: "sport", 2: "tech"}
    model = BertForSequenceClassification.from_pretrained(
        str(src), num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model.save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(folder))
    out = tmp_path / "pkg"
    assert (
        main(
            [
                "export",
                str(folder),
                "-o",
                str(out),
                "--quantize",
                "none",
                "--eval-data",
                str(_held_file(tmp_path)),
            ]
        )
        == 0
    )
    manifest = edgeinfer.Manifest.read(out)
    assert manifest.task == "classify" and manifest.io.labels == ("business", "sport", "tech")
    texts = ["Shares rose after strong profits.", "The striker scored twice."]
    results = edgeinfer.load(out).classify(texts)
    model.eval()
    with torch.inference_mode():
        batch = AutoTokenizer.from_pretrained(str(folder))(texts, padding=True, return_tensors="pt")
        expected = torch.softmax(model(**batch).logits, -1).numpy()
    for result, probs in zip(results, expected, strict=False):
        assert result.label == labels[int(probs.argmax())]
        got = [result.scores[labels[i]] for i in range(3)]
        np.testing.assert_allclose(got, probs, atol=1e-4)
        assert result.exit_layer is None


def test_builtin_text_splits_do_not_overlap(tmp_path: Path) -> None:
    calibration = set(builtin_text("calibration", 128))
    held = set(builtin_text("held", 200))
    assert len(calibration) == 128 and len(held) == 200 and not calibration & held
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert read_text_file(jsonl) == ["one", "two"]
    jsonl.write_text('{"txt": "one"}\n')
    with pytest.raises(edgeinfer.ConfigError, match="text"):
        read_text_file(jsonl)


def test_source_resolution_records_the_window() -> None:
    source = resolve_source("minilm")
    assert source.max_seq_len == 256 and source.model_type == "bert"


def _held_file(tmp_path: Path) -> Path:
    """A small held set, so these tests stay quick (the default gate uses 200 texts)."""
    path = tmp_path / "held.txt"
    if not path.exists():
        path.write_text("\n".join(builtin_text("held", 24)) + "\n")
    return path


@pytest.mark.usefixtures("int8_measured_slower")
def test_int8_slower_than_fp32_is_refused_unless_forced(tmp_path: Path) -> None:
    options = ExportOptions(
        source="minilm", out=tmp_path / "refused", eval_data=_held_file(tmp_path)
    )
    with pytest.raises(SlowerQuantizationError, match="--force-quantize") as refused:
        export(options)
    assert refused.value.report is not None  # what was measured, for --json
    assert refused.value.report["variants"]["int8"]["speed"]["speedup_vs_fp32"] == 0.5
    assert not (tmp_path / "refused").exists()
    forced = export(replace(options, out=tmp_path / "forced", force_quantize=True))
    assert forced.chosen == "int8" and "--force-quantize" in forced.warnings[0]
    assert edgeinfer.Manifest.read(tmp_path / "forced").precision == "int8"


@pytest.mark.usefixtures("int8_measured_slower")
def test_cli_exits_1_on_a_slower_int8_and_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = str(_held_file(tmp_path))
    code = main(["export", "minilm", "-o", str(tmp_path / "p"), "--eval-data", held, "--json"])
    captured = capsys.readouterr()
    assert code == 1 and "quant_slower" in captured.err
    assert json.loads(captured.out)["variants"]["int8"]["speed"]["slower"] is True


def test_static_int8_records_its_calibration(tmp_path: Path) -> None:
    held, calibration = _held_file(tmp_path), tmp_path / "calibration.txt"
    calibration.write_text("\n".join(builtin_text("calibration", 16)) + "\n")
    export(
        ExportOptions(
            source="minilm",
            out=tmp_path / "static",
            quantize="int8-static",
            calibration=calibration,
            eval_data=held,
            force_quantize=True,  # static QDQ on fused ops is slow on CPUs: not the point here
        )
    )
    manifest = edgeinfer.Manifest.read(tmp_path / "static")
    assert manifest.quantization["mode"] == "int8-static"
    assert manifest.quantization["calibration_method"] == "minmax"
    assert manifest.quantization["calibration_size"] == 16
