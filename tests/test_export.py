"""`edgeinfer export` end to end on the real MiniLM model: gates, atomicity, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.cli import main
from edgeinfer.export.calibrate import builtin_text, read_text_file
from edgeinfer.export.source import BUILTINS, resolve_source

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
    assert int8["accuracy"]["passed"] and int8["speedup_vs_fp32"] > 0


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
    out = tmp_path / "pkg"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "export", "minilm", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # kill it in the middle: after conversion, before packaging
        if "convert" in line:
            break
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    # The next export cleans what the killed one left and succeeds.
    result = _cli(
        "export",
        "minilm",
        "-o",
        str(out),
        "--quantize",
        "none",
        "--eval-data",
        str(_held_file(tmp_path)),
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
        ("./no/such/folder", "neither a builtin"),
    ],
)
def test_bad_sources_are_usage_errors(source: str, message: str, tmp_path: Path) -> None:
    result = _cli("export", source, "-o", str(tmp_path / "pkg"))
    assert result.returncode == 2
    assert message in " ".join(result.stderr.split())


def test_corrupt_weights_are_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    src = BUILTINS["minilm"]()
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

    src = BUILTINS["minilm"]()
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
    assert manifest.task == "classify" and manifest.io["labels"] == ["business", "sport", "tech"]
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


def test_int8_slower_than_fp32_is_refused_unless_forced(tmp_path: Path) -> None:
    """Static QDQ on the fused graph leaves most fused ops in fp32 behind Q/DQ pairs: it keeps
    accuracy but runs several times slower than fp32 here, a margin no machine noise hides."""
    held, calibration = _held_file(tmp_path), tmp_path / "calibration.txt"
    calibration.write_text("\n".join(builtin_text("calibration", 16)) + "\n")
    args = ["export", "minilm", "--quantize", "int8-static", "--calibration", str(calibration),
            "--eval-data", str(held), "--json"]
    refused = _cli(*args, "-o", str(tmp_path / "refused"))
    assert refused.returncode == 1, refused.stderr
    assert "quant_slower" in refused.stderr and "--force-quantize" in refused.stderr
    report = json.loads(refused.stdout)  # --json still prints what was measured
    assert report["variants"]["int8"]["speedup_vs_fp32"] < 1
    assert not (tmp_path / "refused").exists()
    forced = _cli(*args, "-o", str(tmp_path / "forced"), "--force-quantize")
    assert forced.returncode == 0, forced.stderr
    shipped = json.loads(forced.stdout)
    assert shipped["chosen"] == "int8" and "--force-quantize" in shipped["warnings"][0]
    manifest = edgeinfer.Manifest.read(tmp_path / "forced")
    assert manifest.quantization["mode"] == "int8-static"
    assert manifest.quantization["calibration_method"] == "minmax"
    assert manifest.quantization["calibration_size"] == 16
