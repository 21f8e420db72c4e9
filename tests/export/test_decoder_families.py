"""Every supported decoder family, exported through the real pipeline from a tiny random model
built from its transformers config, against transformers itself: logits, 20 greedy tokens, and
KV-cached decoding against full recompute; sliding windows shorter and longer than the prompt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import ConversionError
from edgeinfer.export.decoder.graph import SUPPORTED_FAMILIES, DecoderGeometry
from edgeinfer.export.decoder.lm import full_logits
from edgeinfer.export.options import ExportOptions
from edgeinfer.export.run import export
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.decoding import Decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from build_tiny_decoder import FAMILIES, build

sys.path.pop(0)

# Short (6 tokens): the 8-token windows are longer than the prompt and slide during decoding;
# long (21 tokens): the windows are shorter than the prompt.
PROMPTS = {"short": "The market", "long": "Chelsea won the cup after a long season of"}
WINDOW = 8  # the tiny families' sliding window
STEPS = 20
MAX_ABS_LOGIT = 1e-3  # fp32 reassociation on a 2-layer model: ~1e-4 measured


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(name, source folder, package) of one family, exported without quantization."""
    name = str(request.param)
    root = tmp_path_factory.mktemp(f"family-{name}")
    source = build(root / "source", name)
    out = root / "package"
    export(ExportOptions(source=str(source), out=out, quantize="none", held_count=4, threads=1))
    return name, source, out


def test_every_family_matches_transformers_greedy_and_recompute(family: Any) -> None:
    name, source, package = family
    from transformers import AutoModelForCausalLM

    manifest = Manifest.read(package)
    parity = json.loads((package / "report.json").read_text())["variants"]["fp32"]["parity"]
    assert parity["max_abs_logit_diff"] < MAX_ABS_LOGIT and parity["argmax_agreement"] == 1.0
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    gen = Generator(package, manifest, config=RuntimeConfig(threads=1), context_length=64)
    steps = Decoder(package, manifest, config=RuntimeConfig(threads=1), context_length=64)
    session = ort.InferenceSession(str(package / manifest.io.graph))
    for kind, prompt in PROMPTS.items():
        ids = gen.encode(prompt)
        assert (len(ids) < WINDOW) == (kind == "short")
        seq, cached, worst = list(ids), [], 0.0
        step = steps.prefill(ids)  # KV-cached: prefill, then one token at a time
        for _ in range(STEPS):
            with torch.no_grad():  # transformers, full recompute without a cache
                ref = model(torch.tensor([seq])).logits[0, -1].numpy()
            full = full_logits(session, manifest.io, seq)[-1]  # ONNX, full recompute
            worst = max(worst, float(np.abs(ref - step).max()), float(np.abs(full - step).max()))
            cached.append(int(np.argmax(step)))
            assert cached[-1] == int(np.argmax(ref)) == int(np.argmax(full)), (name, prompt)
            seq.append(cached[-1])
            step = steps.decode_one_token(cached[-1], len(seq) - 1)
        assert worst < MAX_ABS_LOGIT, (name, prompt, worst)
        # docs/generation.md per-family table: pytest tests/export/test_decoder_families.py -s
        print(
            f"{name} | {len(ids)} prompt tokens | export parity {parity['max_abs_logit_diff']:.1e}"
            f" | cached vs transformers and recompute {worst:.1e} | greedy {STEPS} equal"
        )


def test_sliding_windows_are_exported_per_layer(family: Any) -> None:
    import onnx

    name, _, package = family
    graph = onnx.load(str(package / Manifest.read(package).io.graph), load_external_data=False)
    windows = [
        next(a.i for a in node.attribute if a.name == "local_window_size")
        for node in graph.graph.node
        if node.op_type == "GroupQueryAttention"
    ]
    expected = {
        "mistral": [8, 8],
        "mistral-long-window": [4096, 4096],
        "qwen2": [-1, 8],  # max_window_layers = 1: the first layer attends fully
        "gemma2": [8, -1],
        "gemma3": [8, -1],
        "phi3": [8, 8],
    }
    assert windows == expected.get(name, [-1, -1])


def test_unsupported_family_names_the_supported_ones() -> None:
    with pytest.raises(ConversionError) as info:
        DecoderGeometry.from_config({"model_type": "gpt2", "n_layer": 2}, context_length=64)
    message = str(info.value)
    assert "'gpt2'" in message and "issue" in message
    assert all(family in message for family in SUPPORTED_FAMILIES)


def test_rotary_dims_the_attention_op_cannot_rotate_are_refused() -> None:
    config = {
        "model_type": "phi3",
        "hidden_size": 96,
        "num_attention_heads": 1,
        "num_hidden_layers": 1,
        "intermediate_size": 8,
        "vocab_size": 8,
        "partial_rotary_factor": 0.75,  # 72 of 96 dims: not a multiple of 16
    }
    with pytest.raises(ConversionError, match="rotary dims"):
        DecoderGeometry.from_config(config, context_length=64)
