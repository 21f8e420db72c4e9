"""Tiny packages made without torch or an export, for the fast lane (``tools/test.sh --fast``).

Each is a real package: an ONNX graph built with the onnx helper API, a real ``tokenizers``
tokenizer where the kind has one, and a manifest with the sha256 of every file, written by
``edgeinfer.manifest`` as the export writes it. They run on real onnxruntime like any package;
what they cannot show (accuracy of a real model) is the full suite's job (MiniLM, SmolLM2, ...).

The tiny decoder is the ``tiny-decoder`` recipe's model (tools/build_tiny_decoder.py: its
geometry, tokenizer and chat template) with numpy weights instead of torch's: its graph is
written by the export's own graph writer (``export/decoder/graph.py``, onnx helper + numpy,
no torch) and laid out as the export lays out a decoder package (aligned external weights,
the io fields of ``export/decoder/builder.io_fields``, the smoke check). tests/test_fast_packages.py
checks it against the exported tiny decoder, field by field.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edgeinfer.manifest import Manifest, file_entries

WORDS = (
    "pump valve pressure rising falling line motor vibration high low temperature sensor "
    "alarm closed open flow tank level steady fast slow the is in of and a"
).split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
DIM = 16  # embedding width of the tiny encoder


def _created_by() -> dict[str, str]:
    import onnx
    import onnxruntime

    return {"edgeinfer": "test", "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def _write(folder: Path, names: list[str], fields: dict[str, Any]) -> Path:
    manifest = {
        "schema_version": 2,
        "created_by": _created_by(),
        "providers": ["cpu"],
        "target": "cpu-avx2",
        "quantization": {"mode": "none"},
        "precision": "fp32",
        "early_exit": None,
        "extra": {},
        "accuracy": {"metric": "none", "reason": "a test package: random weights, no source"},
        "files": {k: v.__dict__ for k, v in file_entries(folder, names).items()},
        **fields,
    }
    Manifest.from_dict(manifest).write(folder)
    return folder


def _tokenizer(path: Path) -> None:
    """A word-level BERT-style tokenizer ([CLS] text [SEP]) over ``WORDS``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(path))


def tiny_encoder(folder: Path, *, seed: int = 0) -> Path:
    """A text-encoder package: token embeddings [V, 16] through a tanh layer, mean-pooled and
    normalized by the runtime as MiniLM's are (the same io, 32-token window)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder / "tokenizer.json")
    rng = np.random.default_rng(seed)
    vocab = len(SPECIAL) + len(WORDS)
    table = numpy_helper.from_array(rng.normal(size=(vocab, DIM)).astype(np.float32), "E")
    weight = numpy_helper.from_array(rng.normal(size=(DIM, DIM)).astype(np.float32) * 0.3, "W")
    ids = ["batch_size", "sequence_length"]
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "input_ids"], ["embedded"]),
            helper.make_node("MatMul", ["embedded", "W"], ["mixed"]),
            helper.make_node("Tanh", ["mixed"], ["last_hidden_state"]),
        ],
        "tiny-encoder",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, ids)
            for name in ("input_ids", "attention_mask", "token_type_ids")
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*ids, DIM])],
        initializer=[table, weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "model.onnx")
    spec = {"dtype": "int64", "shape": ids}
    return _write(
        folder,
        ["model.onnx", "tokenizer.json"],
        {
            "name": "tiny-encoder",
            "task": "embed",
            "source": {"builtin": False, "model_type": "test", "name": "tiny-encoder"},
            "tokens": {"bos": 2, "eos": 3, "pad": 0},
            "io": {
                "kind": "text-encoder",
                "graph": "model.onnx",
                "tokenizer": "tokenizer.json",
                "inputs": [
                    {"name": n, **spec} for n in ("input_ids", "attention_mask", "token_type_ids")
                ],
                "outputs": [
                    {"dtype": "float32", "name": "last_hidden_state", "shape": [*ids, DIM]}
                ],
                "embedding_dim": DIM,
                "max_seq_len": 32,
                "pooling": "mean",
                "normalize": True,
            },
        },
    )


def tiny_raw(folder: Path) -> Path:
    """A stateful raw package: out = state + 2x, stateN = out (tests/onnx_models.accumulator)."""
    from onnx_models import accumulator

    folder.mkdir(parents=True, exist_ok=True)
    accumulator(folder / "model.onnx")
    spec = {"dtype": "float32", "shape": [1, 4]}
    return _write_raw(
        folder,
        "accumulator",
        inputs=[{"name": "x", **spec}, {"name": "state", **spec}],
        outputs=[{"name": "out", **spec}, {"name": "stateN", **spec}],
        state=[{"input": "state", "output": "stateN", **spec}],
    )


def _write_raw(
    folder: Path,
    name: str,
    *,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    state: list[dict[str, Any]],
) -> Path:
    """The manifest of a raw package whose graph is ``folder/model.onnx``."""
    return _write(
        folder,
        ["model.onnx"],
        {
            "name": name,
            "task": "raw",
            "source": {"builtin": False, "model_type": "test", "name": name},
            "tokens": {},
            "io": {
                "kind": "raw",
                "graph": "model.onnx",
                "inputs": inputs,
                "outputs": outputs,
                "state": state,
            },
        },
    )


ENDLESS_TRIPS = 2**62  # a Loop trip count no device finishes: each trip takes microseconds


def tiny_spinner(folder: Path) -> Path:
    """A raw package that hangs only on some inputs: out = x + trips, where a ``Loop`` counts
    its trips = spin * ENDLESS_TRIPS (spin: [1] int64). spin 0 answers at once (out = x);
    spin 1 loops for ever (the kind of package that signs and checks fine, then hangs a
    device on one request)."""
    import onnx
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["count_in", "one"], ["count_out"]),
        ],
        "count",
        [
            helper.make_tensor_value_info("trip", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("count_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("count_out", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["spin", "endless"], ["trips_1"]),  # [1]
            helper.make_node("Squeeze", ["trips_1"], ["trips"]),  # a scalar: Loop's M
            helper.make_node("Loop", ["trips", "always", "zero"], ["count"], body=body),
            helper.make_node("Add", ["x", "count"], ["out"]),  # [1, 4] + [1]
        ],
        "spinner",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("spin", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
        [
            helper.make_tensor("endless", TensorProto.INT64, [1], [ENDLESS_TRIPS]),
            helper.make_tensor("always", TensorProto.BOOL, [], [True]),
            helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")
    return _write_raw(
        folder,
        "spinner",
        inputs=[
            {"name": "x", "dtype": "float32", "shape": [1, 4]},
            {"name": "spin", "dtype": "int64", "shape": [1]},
        ],
        outputs=[{"name": "out", "dtype": "float32", "shape": [1, 4]}],
        state=[],
    )


# -- the tiny decoder ---------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
DECODER_SEED = 0  # numpy's: the weights differ from the torch-built model's, the shapes do not
# What the smoke check records (the export records its held texts' first tokens): short, fixed.
SMOKE_PROMPTS = ("Dollar gains on Greenspan speech. The dollar", "The market rose")


def tiny_decoder_script() -> ModuleType:
    """tools/build_tiny_decoder.py as a module (its tokenizer and chat template; torch is
    imported only by its ``build``)."""
    spec = importlib.util.spec_from_file_location(
        "build_tiny_decoder", REPO / "tools" / "build_tiny_decoder.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decoder_geometry(config: dict[str, Any], vocab: int) -> Any:
    """The export's ``DecoderGeometry`` of a Llama ``config`` (the script's ``CONFIG``), written
    out: ``DecoderGeometry.from_config`` reads a config through transformers."""
    from edgeinfer.export.decoder.families import DecoderGeometry, RopeSpec

    context, layers = int(config["max_position_embeddings"]), int(config["num_hidden_layers"])
    head_dim = int(config["head_dim"])
    return DecoderGeometry(
        family="llama",
        layers=layers,
        hidden=int(config["hidden_size"]),
        heads=int(config["num_attention_heads"]),
        kv_heads=int(config["num_key_value_heads"]),
        head_dim=head_dim,
        intermediate=int(config["intermediate_size"]),
        vocab=vocab,
        context_length=context,
        rms_eps=float(config["rms_norm_eps"]),
        activation="silu",
        attn_scale=head_dim**-0.5,
        rope=RopeSpec(theta=float(config["rope_theta"]), dim=head_dim, original_max=context),
        windows=(-1,) * layers,
    )


def _decoder_state(geo: Any, seed: int, std: float) -> dict[str, np.ndarray]:
    """transformers-named Llama weights [out, in] drawn with deviation ``std`` from ``seed``
    (norms 1, as Llama's start)."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    ones = np.ones(geo.hidden, np.float32)
    q, kv = geo.heads * geo.head_dim, geo.kv_heads * geo.head_dim
    state = {"model.embed_tokens.weight": weight(geo.vocab, geo.hidden), "model.norm.weight": ones}
    for i in range(geo.layers):
        p = f"model.layers.{i}"
        state |= {
            f"{p}.input_layernorm.weight": ones,
            f"{p}.post_attention_layernorm.weight": ones,
            f"{p}.self_attn.q_proj.weight": weight(q, geo.hidden),
            f"{p}.self_attn.k_proj.weight": weight(kv, geo.hidden),
            f"{p}.self_attn.v_proj.weight": weight(kv, geo.hidden),
            f"{p}.self_attn.o_proj.weight": weight(geo.hidden, q),
            f"{p}.mlp.gate_proj.weight": weight(geo.intermediate, geo.hidden),
            f"{p}.mlp.up_proj.weight": weight(geo.intermediate, geo.hidden),
            f"{p}.mlp.down_proj.weight": weight(geo.hidden, geo.intermediate),
        }
    return state


def _decoder_tokenizer(path: Path, script: ModuleType) -> dict[str, Any]:
    """The recipe's byte-level BPE (trained on the built-in text, as the script trains it),
    saved as the export saves a decoder's; returns its special ids and chat format."""
    from tokenizers import Tokenizer

    from edgeinfer.export.data.text import builtin_text
    from edgeinfer.export.decoder.chat_template import chat_format
    from edgeinfer.runtime.generate.chat import render_jinja

    script.build_tokenizer(builtin_text("calibration", 200), path)
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    tok.save(str(path))
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}
    template = str(script.CHAT_TEMPLATE)
    fmt = chat_format(  # checked against jinja's own rendering (the export checks transformers')
        template,
        context=special,
        reference=lambda m: render_jinja(template, m, context=special, add_generation_prompt=True),
    )
    ids = {k: int(tok.token_to_id(v)) for k, v in special.items()}
    stops = sorted({ids["eos_token"], int(tok.token_to_id("<|endoftext|>"))})
    return {
        "vocab": int(tok.get_vocab_size()),
        "tokens": {"bos": ids["bos_token"], "eos": ids["eos_token"], "pad": ids["pad_token"]},
        "stop_token_ids": stops,
        "chat_template": template,
        "chat_format": fmt,
    }


def tiny_decoder(folder: Path, *, seed: int = DECODER_SEED, kv_dtype: str = "float32") -> Path:
    """A ``decoder`` package of the tiny decoder (fp32 weights; ``kv_dtype`` "float16":
    attention over a half-size KV cache), laid out as ``edgeinfer export`` writes one."""
    from edgeinfer.config import RuntimeConfig
    from edgeinfer.export import package
    from edgeinfer.export.decoder.builder import io_fields
    from edgeinfer.export.decoder.graph import build_graph
    from edgeinfer.runtime import load, smoke

    folder.mkdir(parents=True, exist_ok=True)
    script = tiny_decoder_script()
    tok = _decoder_tokenizer(folder / package.TOKENIZER_NAME, script)
    geo = decoder_geometry(script.CONFIG, tok["vocab"])
    state = _decoder_state(geo, seed, float(script.CONFIG["initializer_range"]))
    raw = folder / "fp32.onnx"
    build_graph(state, geo, raw, kv_dtype=kv_dtype)
    files = package.externalize(raw, folder)
    raw.unlink()
    inputs, outputs = package.read_io(files[package.GRAPH_NAME])
    digest = hashlib.sha256(b"".join(state[k].tobytes() for k in sorted(state))).hexdigest()
    io = {
        "kind": "decoder",
        "graph": package.GRAPH_NAME,
        "tokenizer": package.TOKENIZER_NAME,
        "inputs": [spec.__dict__ for spec in inputs],
        "outputs": [spec.__dict__ for spec in outputs],
        "max_seq_len": geo.context_length,
        "source_context_length": int(script.CONFIG["max_position_embeddings"]),
        "stop_token_ids": tok["stop_token_ids"],
        "chat_format": tok["chat_format"],
        "chat_template": tok["chat_template"],
        "add_bos_token": False,
        "light_tokenizer": None,
        **io_fields(geo, kv_dtype=kv_dtype),
    }
    _write(
        folder,
        [*files, package.TOKENIZER_NAME],
        {
            "name": "tiny-decoder",
            "task": "generate",
            "source": {
                "builtin": False,
                "model_type": "llama",
                "name": "tiny-decoder",
                "weights_sha256": digest,
            },
            "tokens": tok["tokens"],
            "io": io,
        },
    )
    config = RuntimeConfig(threads=1, spin_wait=False, warmup_runs=0, verify=False)
    with load(folder, config=config) as model:  # the smoke check, recorded as the export does
        recorded, _ = smoke.record(model, list(SMOKE_PROMPTS))
    manifest = Manifest.read(folder)
    Manifest.from_dict({**manifest.to_dict(), "smoke": recorded}).write(folder)
    return folder
