"""The on-device runtime: stdlib, numpy, onnxruntime and tokenizers only (never torch/onnx)."""

from edgeinfer.runtime.generate.streaming import GenerationResult, TextChunk
from edgeinfer.runtime.metrics import MetricsSnapshot, render_prometheus
from edgeinfer.runtime.model import Model, load
from edgeinfer.runtime.tasks import ClassificationResult, EmbeddingResult

__all__ = [
    "ClassificationResult",
    "EmbeddingResult",
    "GenerationResult",
    "MetricsSnapshot",
    "Model",
    "TextChunk",
    "load",
    "render_prometheus",
]
