"""edgeinfer: fast, small, reliable inference on edge devices.

The public API: ``load()`` a package written by ``edgeinfer export`` and call ``embed`` or
``classify`` on the ``Model``. Importing this module loads no torch, transformers, optimum or onnx.
"""

from edgeinfer.config import (
    BatchConfig,
    CacheConfig,
    PrefixCacheConfig,
    QuantConfig,
    RuntimeConfig,
    SamplingConfig,
    SemanticCacheConfig,
)
from edgeinfer.errors import (
    AccuracyGateError,
    BridgeError,
    BrokerAuthError,
    BrokerUnavailableError,
    ConfigError,
    ContextLengthExceededError,
    ConversionError,
    DeployRefusedError,
    EdgeInferError,
    EpCoverageError,
    ExportError,
    InferenceError,
    InputError,
    IntegrityError,
    ManifestError,
    MissingDependencyError,
    PackageError,
    ParityError,
    ProviderError,
    RequestTimeoutError,
    SlowerQuantizationError,
)
from edgeinfer.manifest import Manifest
from edgeinfer.runtime import (
    ClassificationResult,
    EmbeddingResult,
    GenerationResult,
    MetricsSnapshot,
    Model,
    TextChunk,
    load,
    render_prometheus,
)

__version__ = "0.1.0"

__all__ = [
    "AccuracyGateError",
    "BatchConfig",
    "BridgeError",
    "BrokerAuthError",
    "BrokerUnavailableError",
    "CacheConfig",
    "ClassificationResult",
    "ConfigError",
    "ContextLengthExceededError",
    "ConversionError",
    "DeployRefusedError",
    "EdgeInferError",
    "EmbeddingResult",
    "EpCoverageError",
    "ExportError",
    "GenerationResult",
    "InferenceError",
    "InputError",
    "IntegrityError",
    "Manifest",
    "ManifestError",
    "MetricsSnapshot",
    "MissingDependencyError",
    "Model",
    "PackageError",
    "ParityError",
    "PrefixCacheConfig",
    "ProviderError",
    "QuantConfig",
    "RequestTimeoutError",
    "RuntimeConfig",
    "SamplingConfig",
    "SemanticCacheConfig",
    "SlowerQuantizationError",
    "TextChunk",
    "__version__",
    "load",
    "render_prometheus",
]
