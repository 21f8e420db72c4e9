"""The on-device runtime: stdlib, numpy, onnxruntime and tokenizers only (never torch/onnx);
sentencepiece, optional, for a decoder package's light tokenizer."""

from edgeinfer.runtime.generate.streaming import GenerationResult, TextChunk
from edgeinfer.runtime.kinds.classify import ClassifyModel
from edgeinfer.runtime.kinds.detect import DetectModel
from edgeinfer.runtime.kinds.early_exit import ExitPolicy
from edgeinfer.runtime.kinds.embed import EmbedModel
from edgeinfer.runtime.kinds.generate import GenerateModel
from edgeinfer.runtime.kinds.raw import RawModel
from edgeinfer.runtime.kinds.segment import Segment, SegmentModel
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
    "Segment",
    "SegmentModel",
    "TextChunk",
    "load",
    "render_prometheus",
]
