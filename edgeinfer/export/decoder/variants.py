"""The quantized variants a decoder export tries, each a recipe from the fp32 graph to a graph,
with the gate its weight width must pass.

8-bit variants answer to the int8 gate (perplexity at most +3 % over the fp32 graph, greedy
next-token agreement at least 95 %), 4-bit ones to the int4 gate (+5 %, 90 %). The default is
``int8-weight-only-int8-embed-refined``: every ``MatMul`` in 8-bit ``MatMulNBits`` blocks of 32
at accuracy level 4, the embedding gathered from the lm_head's own 8-bit blocks (each weight
stored once), and the head's top-16 logits recomputed with fp32 activations
(``head.py``). The others stay available by name for comparison (docs/generation.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.export import package
from edgeinfer.export.decoder.embed import quantize_embedding
from edgeinfer.export.decoder.head import refine_head
from edgeinfer.export.passes import quantize

__all__ = ["DEFAULT_VARIANTS", "GATES", "VARIANTS", "Gate", "Variant", "layer_matmuls"]

HEAD = "/lm_head/MatMul"
_PROJECTIONS = ("attn/qkv_proj", "attn/o_proj", "mlp/gate_proj", "mlp/up_proj", "mlp/down_proj")


@dataclass(frozen=True)
class Gate:
    """A quality gate against the fp32 graph on held text."""

    max_ppl_increase: float
    min_agreement: float


GATES = {8: Gate(0.03, 0.95), 4: Gate(0.05, 0.90)}


@dataclass(frozen=True)
class Variant:
    """How to quantize the fp32 graph ``(fp32, out) -> None``, the manifest's description of
    it and the weight width whose gate it answers to."""

    build: Callable[[Path, Path], None]
    info: dict[str, Any] = field(default_factory=dict)
    bits: int = 8

    @property
    def gate(self) -> Gate:
        """The gate of this variant's weight width."""
        return GATES[self.bits]


def layer_matmuls(layers: Sequence[int]) -> list[str]:
    """The ``MatMul`` node names of decoder layers ``layers``."""
    return [f"/model/layers.{i}/{p}/MatMul" for i in layers for p in _PROJECTIONS]


def _layers(graph: Path) -> int:
    import onnx

    nodes = onnx.load(str(graph), load_external_data=False).graph.node
    return sum(1 for n in nodes if n.name.endswith("/attn/GroupQueryAttention"))


def _steps(*steps: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    """The graph transforms ``steps`` applied in turn (intermediate graphs removed)."""

    def run(fp32: Path, out: Path) -> None:
        current = fp32
        for index, step in enumerate(steps):
            target = out if index == len(steps) - 1 else out.with_suffix(f".step{index}.onnx")
            step(current, target)
            if current != fp32:  # a large model's intermediate graph: gigabytes
                for name in [current.name, *package.external_data_files(current)]:
                    (current.parent / name).unlink()
            current = target

    return run


def _int8_fp32_head_edges(fp32: Path, out: Path) -> None:
    edges = layer_matmuls([0, _layers(fp32) - 1])
    quantize.quantize_weight_only(fp32, out, bits=8, exclude=[HEAD, *edges])


def _int4_body(algorithm: str, *, block_size: int = 32) -> Callable[[Path, Path], None]:
    """Every decoder-layer ``MatMul`` in 4 bits (``algorithm``), the head left for the next
    step."""

    def run(fp32: Path, out: Path) -> None:
        quantize.quantize_weight_only(
            fp32, out, bits=4, block_size=block_size, exclude=[HEAD], algorithm=algorithm
        )

    return run


def _int8_rest(fp32: Path, out: Path) -> None:
    quantize.quantize_weight_only(fp32, out, bits=8)  # every MatMul still in fp32


_EMBED, _REFINE = quantize_embedding, refine_head
_SHARED = {"embedding": "int8 blocks of the head", "lm_head_refined_top": 16}


def _int4(algorithm: str) -> Variant:
    return Variant(
        _steps(_int4_body(algorithm), _int8_rest, _EMBED, _REFINE),
        {"mode": "matmulnbits", "bits": 4, "algorithm": algorithm, "lm_head_bits": 8, **_SHARED},
        bits=4,
    )


VARIANTS: dict[str, Variant] = {
    "int8-weight-only-int8-embed-refined": Variant(
        _steps(_int8_rest, _EMBED, _REFINE),
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "accuracy_level": 4, **_SHARED},
    ),
    "int8-weight-only-int8-embed": Variant(
        _steps(_int8_rest, _EMBED),
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "embedding": "int8 blocks"},
    ),
    "int8-weight-only-fp32-head-edges-int8-embed": Variant(
        _steps(_int8_fp32_head_edges, _EMBED),
        {
            "mode": "matmulnbits",
            "bits": 8,
            "block_size": 32,
            "excluded": "lm_head, layers 0, -1",
            "embedding": "int8 blocks",
        },
    ),
    "int8-weight-only-fp32-head-edges": Variant(
        _int8_fp32_head_edges,
        {"mode": "matmulnbits", "bits": 8, "block_size": 32, "excluded": "lm_head, layers 0, -1"},
    ),
    "int8-dynamic": Variant(
        lambda a, b: quantize.quantize_decoder_dynamic(a, b, exclude=[HEAD]),
        {"mode": "int8-dynamic", "per_channel": True, "weights": "uint8", "excluded": [HEAD]},
    ),
    "int4-rtn-int8-embed-refined": _int4("rtn"),
    "int4-rtn-asym-int8-embed-refined": _int4("rtn-asym"),
    "int4-kquant-int8-embed-refined": _int4("k_quant"),
    "int4-hqq-int8-embed-refined": _int4("hqq"),
}

# Tried when no variants are named: the int8 ones that can pass the int8 gate, the smallest and
# fastest first; 4-bit variants are asked for by name (their package answers to its own gate).
DEFAULT_VARIANTS = (
    "int8-weight-only-int8-embed-refined",
    "int8-weight-only-fp32-head-edges-int8-embed",
)
