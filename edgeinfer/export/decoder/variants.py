"""The quantized variants a decoder export tries, each a recipe from the fp32 graph to a graph,
with the gate its weight width must pass.

8-bit variants answer to the int8 gate (perplexity at most +3 % over the fp32 graph, greedy
next-token agreement at least 95 %), 4-bit ones to the int4 gate (+5 %, 90 %). The first
default is ``int8-weight-only-int8-embed-rank4-refined``: every layer ``MatMul`` in 8-bit
``MatMulNBits`` blocks of 32 at accuracy level 4, the embedding gathered from an 8-bit table,
the head ranked by a 4-bit copy of that table (split in pieces, ``head.split_head``) and its
top-64 logits recomputed with fp32 activations from the table's rows (``head.py``); only for
heads tied to the embedding. Then ``int8-weight-only-int8-embed-refined``: the head in 8 bits,
the embedding gathered from its own blocks (each weight stored once), its top-64 refined the
same way. The others stay available by name for comparison (docs/generation.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.export import package
from edgeinfer.export.decoder.embed import quantize_embedding
from edgeinfer.export.decoder.head import REFINE_TOKENS, SPLIT_WEIGHT_BYTES, refine_head, split_head
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
    # Why this recipe cannot apply to an fp32 graph (None: it can); such a variant is skipped.
    unsuitable: Callable[[Path], str | None] | None = None

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


_EMBED, _REFINE, _TABLE = quantize_embedding, refine_head, "model.embed_tokens.weight"
_SHARED = {"embedding": "int8 blocks of the head", "lm_head_refined_top": REFINE_TOKENS}


def _untied(fp32: Path) -> str | None:
    """Why a ranking copy cannot stand in for this graph's head (None: it can): the exact rows
    it is refined from are the 8-bit embedding table, so the head must be that table."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(fp32))
    inits = {i.name: i for i in model.graph.initializer}
    head = next((n for n in model.graph.node if n.name == HEAD), None)
    if head is None or head.input[1] not in inits or _TABLE not in inits:
        return "the graph has no float lm_head and embedding table to compare"
    weight = numpy_helper.to_array(inits[head.input[1]])  # [d, V]
    table = numpy_helper.to_array(inits[_TABLE])  # [V, d]
    if weight.T.shape != table.shape or not np.array_equal(weight.T, table):
        return "the lm_head is not tied to the embedding table"
    return None


def _rank4_head(fp32: Path, out: Path) -> None:
    """The head alone in 4-bit blocks: a ranking copy, half the 8-bit head's prepacked bytes
    (the refinement reads the exact rows from the 8-bit embedding table)."""
    quantize.quantize_weight_only(fp32, out, bits=4, include=[HEAD])


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
    "int8-weight-only-int8-embed-rank4-refined": Variant(
        _steps(_rank4_head, _int8_rest, _EMBED, _REFINE, split_head),
        {
            "mode": "matmulnbits",
            "bits": 8,
            "block_size": 32,
            "accuracy_level": 4,
            "embedding": "int8 blocks",
            "lm_head_ranking_bits": 4,
            "lm_head_split_bytes": SPLIT_WEIGHT_BYTES,
            "lm_head_refined_top": REFINE_TOKENS,
        },
        unsuitable=_untied,
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
# The ranking copy holds the least memory (Gemma 3: 94 MB less anonymous memory, SmolLM2: 18
# MB) and decodes faster where the head is most of the weights (Gemma 3: 1.21x, perplexity
# +1.3 %); on SmolLM2 it passes (+1.9 %) but is no faster, so the smaller package ships.
DEFAULT_VARIANTS = (
    "int8-weight-only-int8-embed-rank4-refined",
    "int8-weight-only-int8-embed-refined",
    "int8-weight-only-fp32-head-edges-int8-embed",
)
