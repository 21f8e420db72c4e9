"""Tiny packages made without torch or an export, for the fast lane (``tools/test.sh --fast``).

Each is a real package: an ONNX graph built with the onnx helper API, a real ``tokenizers``
tokenizer where the kind has one, and a manifest with the sha256 of every file, written by
``edgeinfer.manifest`` as the export writes it. They run on real onnxruntime like any package;
what they cannot show (accuracy of a real model) is the full suite's job (MiniLM, SmolLM2, ...).
"""

from __future__ import annotations

from pathlib import Path
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
    return _write(
        folder,
        ["model.onnx"],
        {
            "name": "accumulator",
            "task": "raw",
            "source": {"builtin": False, "model_type": "test", "name": "accumulator"},
            "tokens": {},
            "io": {
                "kind": "raw",
                "graph": "model.onnx",
                "inputs": [{"name": "x", **spec}, {"name": "state", **spec}],
                "outputs": [{"name": "out", **spec}, {"name": "stateN", **spec}],
                "state": [{"input": "state", "output": "stateN", **spec}],
            },
        },
    )
