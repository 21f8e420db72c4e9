"""The named hardware presets: how ``edgeinfer export`` optimizes and quantizes for a target.

Presets are classmethods so that a target is one name (``QuantConfig.cpu_avx2()``), never a bag
of flags copied between call sites; ``TARGETS`` maps each CLI name to its preset. Every
non-obvious default carries a one-line reason. Re-exported by ``edgeinfer.config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edgeinfer.errors import ConfigError

__all__ = ["QUANT_MODES", "TARGETS", "CalibrationMethod", "QuantConfig", "QuantMode"]

QuantMode = Literal["none", "int8", "int8-static", "fp16"]
QUANT_MODES: tuple[str, ...] = ("none", "int8", "int8-static", "fp16")
CalibrationMethod = Literal["minmax", "entropy", "percentile"]


@dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """How ``edgeinfer export`` optimizes and quantizes for one hardware target.

    Use a preset (``QuantConfig.cpu_avx2()``, ``.cpu_vnni()``, ``.cpu_arm64()``, ``.npu_qnn()``,
    ``.npu_openvino()``, ``.gpu_cuda()``, ``.gpu_tensorrt()``; docs/targets.md) and override
    with ``dataclasses.replace`` when needed.
    """

    target: str
    mode: QuantMode = "int8"
    per_channel: bool = True
    reduce_range: bool = False
    activation_symmetric: bool = False
    calibration_method: CalibrationMethod = "minmax"
    # "percentile": the activation percentile kept (onnxruntime's default).
    calibration_percentile: float = 99.999
    calibration_size: int = 128
    providers: tuple[str, ...] = ("cpu",)
    ops_to_quantize: tuple[str, ...] = field(
        default=("MatMul", "Attention", "EmbedLayerNormalization")
    )
    # static int8 of CNNs: activations' and weights' integer types (onnxruntime QuantType names).
    # uint8 activations: onnxruntime's CPU provider ran int8 (S8S8) EfficientNet-Lite0 at 0.7x
    # fp32's speed on AVX-512 VNNI, uint8 (U8S8) at 1.9x (docs/vision.md).
    activation_type: Literal["uint8", "int8", "uint16"] = "uint8"
    weight_type: Literal["int8", "uint8"] = "int8"
    # static int8 of CNNs on AVX2 without VNNI: 7-bit GEMM weights and the stem in float
    # (``ort_compat.avx2_weight_overrides``); other CPUs and NPUs have no int16 saturation.
    avx2_saturation_workaround: bool = False
    # static int8: "fixed" keeps only the workaround's nodes in float; "sensitivity" also the
    # fewest that the tune images need to pass the gate (``export.passes.sensitivity``).
    float_nodes: Literal["fixed", "sensitivity"] = "fixed"
    # each float node adds a dequantize/quantize pair around it and runs in fp32: a cap keeps
    # the int8 speed-up (8: under 10 % of EfficientNet-Lite0's convolutions)
    max_float_nodes: int = 8
    # static int8 of CNNs: how the int8 weights are rounded. "nearest": onnxruntime's own;
    # "gptq": each layer's rounding errors compensated on the calibration data
    # (``export.passes.rounding``; MobileNetV2's gate 87.5 % -> 92.8 %), same graph and speed.
    weight_rounding: Literal["nearest", "gptq"] = "nearest"
    # "ort": onnxruntime's own QDQ rules; "qnn": its QNN helpers' (get_qnn_qdq_config).
    qdq_rules: Literal["ort", "qnn"] = "ort"
    # a fixed batch size written into the graph (NPUs compile static shapes); None: dynamic.
    fixed_batch: int | None = None
    # TensorRT: the engine-cache folder inside the package, recorded in the manifest.
    engine_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in QUANT_MODES:
            raise ConfigError(
                f"unknown quantization mode {self.mode!r}: use {', '.join(QUANT_MODES)}"
            )
        if self.fixed_batch is not None and self.fixed_batch < 1:
            raise ConfigError(f"fixed_batch must be >= 1 or None, got {self.fixed_batch}")
        if self.calibration_method not in ("minmax", "entropy", "percentile"):
            raise ConfigError(
                f"unknown calibration method {self.calibration_method!r}: "
                "use minmax, entropy or percentile"
            )
        if self.max_float_nodes < 0:
            raise ConfigError(f"max_float_nodes must be >= 0, got {self.max_float_nodes}")
        if self.float_nodes == "sensitivity" and self.qdq_rules == "qnn":
            raise ConfigError(
                "float_nodes='sensitivity' needs onnxruntime's generic QDQ rules: the QNN HTP "
                "runs quantized nodes only (a float node would move to the CPU)"
            )
        if self.weight_rounding not in ("nearest", "gptq"):
            raise ConfigError(
                f"unknown weight_rounding {self.weight_rounding!r}: use nearest or gptq"
            )
        if self.weight_rounding == "gptq" and self.qdq_rules == "qnn":
            raise ConfigError(
                "weight_rounding='gptq' re-rounds graphs of onnxruntime's generic QDQ rules; "
                "the QNN helpers' graphs keep nearest rounding"
            )
        if self.calibration_size < 1:
            raise ConfigError(f"calibration_size must be >= 1, got {self.calibration_size}")
        if not 50.0 < self.calibration_percentile <= 100.0:
            raise ConfigError(
                f"calibration_percentile must be in (50, 100], got {self.calibration_percentile}"
            )

    @classmethod
    def cpu_avx2(cls) -> QuantConfig:
        """x86-64 with AVX2 and no VNNI (most industrial PCs and older Xeons).

        Dynamic int8, per-channel weights: per-tensor scales cost 0.04 cosine on MiniLM (mean
        0.953 vs 0.993 against PyTorch fp32 on 200 held BBC News texts). reduce_range stays off:
        the 7-bit weights that dodge the AVX2 u8*s8 int16 saturation measured no more accurate
        there (mean 0.993 either way, min 0.984 vs 0.988), and per-channel scales already keep
        the products small. Static int8 of CNNs takes the AVX2 saturation workaround.
        """
        return cls(target="cpu-avx2", avx2_saturation_workaround=True)

    @classmethod
    def cpu_vnni(cls) -> QuantConfig:
        """x86-64 with AVX-512 VNNI or AVX-VNNI: the u8*s8 dot product has no saturation
        risk there, so the full 8-bit range is safe; otherwise as ``cpu_avx2``."""
        return cls(target="cpu-vnni")

    @classmethod
    def cpu_arm64(cls) -> QuantConfig:
        """64-bit Arm (Raspberry Pi 4/5, Jetson CPU cores, Graviton).

        onnxruntime's Arm int8 GEMM uses the sdot/udot instructions with signed weights, so the
        same dynamic per-channel int8 as x86 applies; there is no saturation issue to dodge.
        """
        return cls(target="cpu-arm64")

    @classmethod
    def npu_qnn(cls) -> QuantConfig:
        """Qualcomm NPUs (Hexagon HTP) through onnxruntime's QNN provider.

        Static QDQ built by onnxruntime's own QNN helpers (``get_qnn_qdq_config`` after
        ``qnn_preprocess_model``), so the graph holds only what the HTP takes, with a fixed
        batch of 1 because the HTP compiles one static shape. uint16 activations with
        per-channel symmetric int8 weights (the HTP's "A16W8"): the helpers' default, uint8
        per-tensor weights, kept 50 % top-1 agreement on EfficientNet-Lite0's decided gate
        views (depthwise filters differ too much for one scale); A16W8 kept 100 %.
        """
        return cls(
            target="npu-qnn",
            mode="int8-static",
            activation_type="uint16",
            qdq_rules="qnn",
            fixed_batch=1,
            providers=("qnn", "cpu"),
        )

    @classmethod
    def npu_openvino(cls) -> QuantConfig:
        """Intel NPUs and iGPUs through OpenVINO: static QDQ as OpenVINO's importer expects,
        per-channel symmetric int8 weights with uint8 activations, fixed batch 1 (the NPU
        plugin compiles static shapes)."""
        return cls(
            target="npu-openvino",
            mode="int8-static",
            fixed_batch=1,
            providers=("openvino", "cpu"),
        )

    @classmethod
    def gpu_cuda(cls) -> QuantConfig:
        """NVIDIA GPUs through CUDA: fp16 weights and activations (tensor cores), fp32
        inputs and outputs so callers never handle half floats; ops that overflow or lose
        range in fp16 stay fp32 (``ort_compat.FP16_KEEP_FP32_OPS``)."""
        return cls(target="gpu-cuda", mode="fp16", providers=("cuda", "cpu"))

    @classmethod
    def gpu_tensorrt(cls) -> QuantConfig:
        """NVIDIA GPUs through TensorRT: the fp16 graph of ``gpu_cuda``; the engine built
        from it on the device is cached in the package's ``trt_engines/`` so that only the
        first start (or ``tools/gpu_check.sh`` at install) pays the minutes-long build."""
        return cls(
            target="gpu-tensorrt",
            mode="fp16",
            providers=("tensorrt", "cuda", "cpu"),
            engine_cache_dir="trt_engines",
        )

    @classmethod
    def for_target(cls, target: str) -> QuantConfig:
        """Return the preset named ``target`` (see ``TARGETS``)."""
        try:
            return TARGETS[target]()
        except KeyError:
            raise ConfigError(
                f"unknown target {target!r}: choose one of {', '.join(sorted(TARGETS))}"
            ) from None


TARGETS = {
    "cpu-avx2": QuantConfig.cpu_avx2,
    "cpu-vnni": QuantConfig.cpu_vnni,
    "cpu-arm64": QuantConfig.cpu_arm64,
    "npu-qnn": QuantConfig.npu_qnn,
    "npu-openvino": QuantConfig.npu_openvino,
    "gpu-cuda": QuantConfig.gpu_cuda,
    "gpu-tensorrt": QuantConfig.gpu_tensorrt,
}
