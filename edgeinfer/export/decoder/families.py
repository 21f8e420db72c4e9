"""What differs between decoder families, read from a transformers config: the geometry, the
rotary tables, the norms, the activation, the attention windows.

A family is a set of switches on one layer layout (RMSNorm -> attention with GQA and rotary ->
RMSNorm -> gated MLP); the graph writer (``graph.py``) reads only ``DecoderGeometry``. The
rotary tables follow transformers' ``modeling_rope_utils`` for the rope types a package's
context can use; ``dynamic`` and ``longrope`` switch frequencies beyond the pretraining length,
so their packages stop there (at that length both equal the unscaled / short-factor tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError, MissingDependencyError

__all__ = ["SUPPORTED_FAMILIES", "DecoderGeometry", "RopeSpec", "canonical_state", "rope_tables"]


@dataclass(frozen=True)
class _Family:
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (1 + w)
    embed_scale: bool = False  # Gemma scales the embeddings by sqrt(hidden)
    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotary (Qwen3, Gemma 3)
    sandwich: bool = False  # Gemma 2/3: post-attention, pre- and post-feedforward norms
    pre_attn_scalar: bool = False  # attention scale = query_pre_attn_scalar ** -0.5
    local_rope: bool = False  # sliding layers use rope_local_base_freq without scaling
    fused: bool = False  # Phi-3: qkv_proj and gate_up_proj are single matrices


_FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "mistral": _Family(),
    "qwen2": _Family(),
    "qwen3": _Family(qk_norm=True),
    "gemma": _Family(norm_offset=1.0, embed_scale=True),
    "gemma2": _Family(norm_offset=1.0, embed_scale=True, sandwich=True, pre_attn_scalar=True),
    "gemma3_text": _Family(
        norm_offset=1.0,
        embed_scale=True,
        qk_norm=True,
        sandwich=True,
        pre_attn_scalar=True,
        local_rope=True,
    ),
    "phi3": _Family(fused=True),
}
SUPPORTED_FAMILIES = tuple(sorted(_FAMILIES))
# transformers' activation names -> the graph's: the exact erf GELU, the tanh one, SiLU.
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}
_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "longrope")


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: base, rotated dims and the scaling transformers applies."""

    theta: float
    dim: int  # rotated dims per head (head_dim x partial_rotary_factor)
    kind: str = "default"  # default | linear | llama3 | longrope ("dynamic" is default here)
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max: int = 0
    short_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0  # cos and sin are multiplied by it (longrope)


@dataclass(frozen=True)
class DecoderGeometry:
    """A decoder's shape and family switches, as the graph and the KV cache need them."""

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context_length: int
    rms_eps: float
    activation: str
    attn_scale: float
    rope: RopeSpec
    rope_local: RopeSpec | None = None  # the sliding layers' table (Gemma 3)
    windows: tuple[int, ...] = ()  # per layer: the sliding window in tokens, or -1 (full)
    norm_offset: float = 0.0
    embed_scale: float | None = None
    qk_norm: bool = False
    sandwich: bool = False
    fused: bool = False
    attn_softcap: float = 0.0  # 0: none
    final_softcap: float = 0.0  # 0: none

    @classmethod
    def from_config(cls, config: dict[str, Any], *, context_length: int) -> DecoderGeometry:
        """Read the geometry from a transformers config (defaults filled in by its config
        class); refuse what the graph cannot express."""
        cfg = _full_config(config)
        model_type = str(cfg.get("model_type"))
        family = _FAMILIES.get(model_type)
        if family is None:
            raise ConversionError(
                f"generation export does not support {model_type!r} decoders yet; supported "
                f"families: {', '.join(SUPPORTED_FAMILIES)}. To ask for one, open an issue on "
                "edgeinfer's tracker with the model's config.json."
            )
        act_name = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu")
        if act_name not in _ACTIVATIONS:
            raise ConversionError(f"activation {act_name!r} is not supported")
        heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        rope, context = _rope(cfg, head_dim, context_length)
        layers = int(cfg["num_hidden_layers"])
        windows = _windows(cfg, layers)
        scalar = cfg.get("query_pre_attn_scalar") if family.pre_attn_scalar else None
        return cls(
            family=model_type,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            context_length=context,
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            activation=_ACTIVATIONS[act_name],
            attn_scale=float(scalar if scalar else head_dim) ** -0.5,
            rope=rope,
            rope_local=(
                RopeSpec(theta=float(cfg["rope_local_base_freq"]), dim=rope.dim)
                if family.local_rope
                else None
            ),
            windows=windows,
            norm_offset=family.norm_offset,
            embed_scale=math.sqrt(hidden) if family.embed_scale else None,
            qk_norm=family.qk_norm,
            sandwich=family.sandwich,
            fused=family.fused,
            attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
            final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        )


def _full_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the defaults its transformers config class adds (Mistral's 4096-token
    window, Qwen's and Gemma's ``layer_types``) that a config.json may leave out."""
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise MissingDependencyError("transformers", "export") from exc
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        return config
    fields = {k: v for k, v in config.items() if k != "model_type"}
    return dict(AutoConfig.for_model(str(model_type), **fields).to_dict())


def _windows(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Per layer: the sliding window (the layer attends to its last ``w`` positions, itself
    included) or -1 for full attention."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if not window:
        return (-1,) * layers
    if types:
        return tuple(int(window) if t == "sliding_attention" else -1 for t in types)
    return (int(window),) * layers  # Mistral, Phi-3: every layer slides


def _rope(cfg: dict[str, Any], head_dim: int, context: int) -> tuple[RopeSpec, int]:
    """The global rotary table's spec and the package context it allows."""
    theta = float(cfg.get("rope_theta", 10000.0))
    dim = int(head_dim * float(cfg.get("partial_rotary_factor") or 1.0))
    if dim % 16:  # GroupQueryAttention's rotary takes cos/sin tables of 8k columns
        raise ConversionError(
            f"{dim} rotary dims per head are not supported (GroupQueryAttention rotates a "
            "multiple of 16)"
        )
    scaling = cfg.get("rope_scaling") or {}
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default")
    if kind not in _ROPE_TYPES:
        raise ConversionError(
            f"rope_scaling type {kind!r} is not supported (supported: {', '.join(_ROPE_TYPES)})"
        )
    max_pos = int(cfg.get("max_position_embeddings") or context)
    original = int(
        scaling.get("original_max_position_embeddings")
        or cfg.get("original_max_position_embeddings")
        or max_pos
    )
    if kind == "dynamic":  # NTK scaling starts beyond the original length
        return RopeSpec(theta=theta, dim=dim), min(context, original)
    if kind == "longrope":  # transformers takes Phi-3's factor from the two lengths
        if cfg.get("original_max_position_embeddings"):
            original = int(cfg["original_max_position_embeddings"])
            factor = max_pos / original
        else:
            original, factor = max_pos, float(scaling.get("factor", 1.0))
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = (
                1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
            )
        spec = RopeSpec(
            theta=theta,
            dim=dim,
            kind=kind,
            short_factor=tuple(float(f) for f in scaling["short_factor"]),
            attention_factor=float(attention),
        )
        return spec, min(context, original)  # the long factors start beyond it
    spec = RopeSpec(
        theta=theta,
        dim=dim,
        kind=kind,
        factor=float(scaling.get("factor", 1.0)),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max=original,
    )
    return spec, context


def rope_tables(spec: RopeSpec, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [length, dim/2] float32 of the (non-interleaved, rotate_half) rotary."""
    exponent = np.arange(0, spec.dim, 2, dtype=np.float64) / spec.dim
    inv_freq = 1.0 / (spec.theta**exponent)  # [dim/2]
    if spec.kind == "linear":
        inv_freq = inv_freq / spec.factor
    elif spec.kind == "llama3":
        inv_freq = _llama3(inv_freq, spec)
    elif spec.kind == "longrope":
        inv_freq = inv_freq / np.asarray(spec.short_factor, np.float64)
    angles = np.outer(np.arange(length, dtype=np.float64), inv_freq)
    scale = spec.attention_factor
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


def _llama3(inv_freq: np.ndarray, spec: RopeSpec) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling: long wavelengths slowed by ``factor``, short
    ones kept, the band between interpolated."""
    low_wavelen = spec.original_max / spec.low_freq_factor
    high_wavelen = spec.original_max / spec.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / spec.factor, inv_freq)
    smooth = (spec.original_max / wavelen - spec.low_freq_factor) / (
        spec.high_freq_factor - spec.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    result: np.ndarray = np.where(medium, smoothed, scaled)
    return result


def canonical_state(state: dict[str, np.ndarray], geo: DecoderGeometry) -> dict[str, np.ndarray]:
    """``state`` with every family's weights under Llama's names (Phi-3's fused ``qkv_proj``
    and ``gate_up_proj`` split into q/k/v and gate/up)."""
    if not geo.fused:
        return state
    out = dict(state)
    q_rows, kv_rows = geo.heads * geo.head_dim, geo.kv_heads * geo.head_dim
    for i in range(geo.layers):
        p = f"model.layers.{i}"
        qkv = out.pop(f"{p}.self_attn.qkv_proj.weight")
        out[f"{p}.self_attn.q_proj.weight"] = qkv[:q_rows]
        out[f"{p}.self_attn.k_proj.weight"] = qkv[q_rows : q_rows + kv_rows]
        out[f"{p}.self_attn.v_proj.weight"] = qkv[q_rows + kv_rows :]
        gate_up = out.pop(f"{p}.mlp.gate_up_proj.weight")
        out[f"{p}.mlp.gate_proj.weight"] = gate_up[: geo.intermediate]
        out[f"{p}.mlp.up_proj.weight"] = gate_up[geo.intermediate :]
    return out
