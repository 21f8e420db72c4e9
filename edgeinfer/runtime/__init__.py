"""The on-device runtime: stdlib, numpy, onnxruntime and tokenizers only (never torch/onnx);
sentencepiece, optional, for a decoder package's light tokenizer."""

from edgeinfer.runtime.early_exit import ExitPolicy
from edgeinfer.runtime.generate.streaming import GenerationResult, TextChunk
from edgeinfer.runtime.handles import (
    ClassifyModel,
    DetectModel,
    EmbedModel,
    GenerateModel,
    RawModel,
)
from edgeinfer.runtime.metrics import MetricsSnapshot, render_prometheus
from edgeinfer.runtime.model import Model, load
from edgeinfer.runtime.tasks import ClassificationResult, Detection, EmbeddingResult

__all__ = [
    "ClassificationResult",
    "ClassifyModel",
    "DetectModel",
    "Detection",
    "EmbedModel",
    "EmbeddingResult",
    "ExitPolicy",
    "GenerateModel",
    "GenerationResult",
    "MetricsSnapshot",
    "Model",
    "RawModel",
    "TextChunk",
    "load",
    "render_prometheus",
]
