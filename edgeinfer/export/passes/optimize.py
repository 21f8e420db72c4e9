"""ONNX Runtime's transformer optimizer: fuse attention, layer norms and GELU for the CPU."""

from __future__ import annotations

import logging
from pathlib import Path

from edgeinfer.export.source import Source

__all__ = ["optimize"]

log = logging.getLogger(__name__)

# The optimizer's fusion patterns by transformers model_type; other encoders share BERT's.
_OPTIMIZER_TYPES = {"bert": "bert", "roberta": "bert", "distilbert": "bert", "xlm-roberta": "bert"}


def optimize(source: Source, graph: Path, out_path: Path) -> dict[str, int]:
    """Fuse ``graph`` into ``out_path``; return the fused operator counts.

    opt_level 0 applies the transformer fusions only and leaves onnxruntime's own (hardware
    dependent) optimizations to load time on the device, so one package fits every CPU target.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    config = source.config
    heads = int(config.get("num_attention_heads", 0))
    hidden = int(config.get("hidden_size", 0))
    pruned = config.get("pruned_heads") or {}
    if pruned and heads:  # a pruned student: as many heads left in every layer, same head size
        left = heads - len(next(iter(pruned.values())))
        heads, hidden = left, hidden // heads * left
    model = optimize_model(
        str(graph),
        model_type=_OPTIMIZER_TYPES.get(source.model_type, "bert"),
        num_heads=heads,
        hidden_size=hidden,
        opt_level=0,
    )
    model.save_model_to_file(str(out_path))
    fused = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    log.info("fused operators: %s", fused)
    return fused
