"""Llama-family decoders -> one ONNX graph with ONNX Runtime's fused decoder ops.

Why this route (and not optimum-onnx's ``text-generation-with-past`` or torch.onnx): those
graphs concatenate ``past`` and the new keys into a fresh ``present`` tensor every token, so the
whole cache is copied per token and cannot be written in place. Here the graph is written
directly from the weights, as onnxruntime-genai's model builder does, with
``GroupQueryAttention`` (rotary embedding inside, KV appended in place when ``past`` and
``present`` share one buffer), ``SkipSimplifiedLayerNormalization`` (RMSNorm fused with the
residual add) and one packed QKV ``MatMul`` per layer. Plain ``onnxruntime`` runs it (no
onnxruntime-genai at run time) and every ``MatMul`` weight is a ``[K, N]`` initializer that the
int8/int4 quantizers understand.

Graph I/O (batch B, new tokens S, KV buffer length P, total length T)::

    input_ids [B, S] int64, attention_mask [B, T] int64, position_ids [B, S] int64,
    past_key_values.{i}.key|value [B, H_kv, P, D] float32
    -> logits [B, S, V] float32, present.{i}.key|value [B, H_kv, max(P, T), D] float32
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError

__all__ = ["DecoderGeometry", "build_graph", "io_fields"]

_SUPPORTED = ("llama",)
# GroupQueryAttention, SkipSimplifiedLayerNormalization and MatMulNBits live in ORT's contrib
# domain; opset 17 for the ONNX domain is what onnxruntime >= 1.14 runs.
_OPSET = 17


@dataclass(frozen=True)
class DecoderGeometry:
    """The shape of a Llama-family decoder, as the graph and the KV cache need it."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context_length: int
    rope_theta: float
    rms_eps: float

    @classmethod
    def from_config(cls, config: dict[str, Any], *, context_length: int) -> DecoderGeometry:
        """Read the geometry from a transformers ``config.json``; refuse what the graph lacks."""
        model_type = str(config.get("model_type"))
        if model_type not in _SUPPORTED:
            raise ConversionError(
                f"generation export supports {', '.join(_SUPPORTED)} decoders, not {model_type!r}"
            )
        if config.get("rope_scaling"):
            raise ConversionError(f"rope_scaling {config['rope_scaling']!r} is not supported")
        if config.get("attention_bias") or config.get("mlp_bias"):
            raise ConversionError("decoders with attention or MLP biases are not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise ConversionError(f"activation {config.get('hidden_act')!r} is not supported")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            context_length=context_length,
            rope_theta=float(config.get("rope_theta", 10000.0)),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        )


def io_fields(geo: DecoderGeometry) -> dict[str, Any]:
    """The manifest's decoder ``io`` fields: geometry and the KV input/output names."""
    return {
        "num_layers": geo.layers,
        "num_kv_heads": geo.kv_heads,
        "head_dim": geo.head_dim,
        "vocab_size": geo.vocab,
        "context_length": geo.context_length,
        "kv_layout": "shared-buffer",  # past and present are bound to one preallocated buffer
        "past_names": [
            [f"past_key_values.{i}.key", f"past_key_values.{i}.value"] for i in range(geo.layers)
        ],
        "present_names": [[f"present.{i}.key", f"present.{i}.value"] for i in range(geo.layers)],
    }


def _rope_caches(geo: DecoderGeometry) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [context, D/2] of the (non-interleaved, rotate_half) Llama rotary."""
    exponent = np.arange(0, geo.head_dim, 2, dtype=np.float64) / geo.head_dim
    inv_freq = 1.0 / (geo.rope_theta**exponent)  # [D/2]
    angles = np.outer(np.arange(geo.context_length, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def build_graph(state: dict[str, np.ndarray], geo: DecoderGeometry, out_path: Path) -> None:
    """Write the fp32 decoder graph for the transformers ``state`` dict (numpy arrays)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits: list[Any] = []
    nodes: list[Any] = []

    def weight(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array, np.float32), name))
        return name

    def node(op: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> None:
        domain = (
            "com.microsoft"
            if op in ("GroupQueryAttention", "SkipSimplifiedLayerNormalization")
            else ""
        )
        nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))

    def get(key: str) -> np.ndarray:
        if key not in state:
            raise ConversionError(f"the source weights have no {key}")
        return state[key]

    embed = get("model.embed_tokens.weight")  # [V, d]
    lm_head = state.get("lm_head.weight", embed)  # tied: its own copy, quantized on its own
    cos, sin = _rope_caches(geo)
    weight("model.embed_tokens.weight", embed)
    weight("cos_cache", cos)
    weight("sin_cache", sin)
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one_i64"))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes_1"))
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "idx_1"))

    node("Gather", ["model.embed_tokens.weight", "input_ids"], ["embeds"], "/embed/Gather")
    # seqlens_k: [B] int32 = valid length - 1; total_sequence_length: scalar int32 = T.
    node("ReduceSum", ["attention_mask", "axes_1"], ["mask_sum"], "/mask/ReduceSum", keepdims=0)
    node("Sub", ["mask_sum", "one_i64"], ["seqlens_k_64"], "/mask/Sub")
    node("Cast", ["seqlens_k_64"], ["seqlens_k"], "/mask/Cast", to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"], "/mask/Shape")
    node("Gather", ["mask_shape", "idx_1"], ["total_64"], "/mask/Gather", axis=0)
    node("Cast", ["total_64"], ["total_len"], "/mask/CastTotal", to=TensorProto.INT32)

    residual, pending = "embeds", ""  # pending: the block output not yet added to residual
    for i in range(geo.layers):
        p = f"model.layers.{i}"
        x = f"/l{i}/in_norm"
        if pending:
            node(
                "SkipSimplifiedLayerNormalization",
                [
                    pending,
                    residual,
                    weight(f"{p}.input_layernorm.weight", get(f"{p}.input_layernorm.weight")),
                ],
                [x, "", "", f"/l{i}/res_in"],
                f"/model/layers.{i}/input_layernorm/SkipLayerNorm",
                epsilon=geo.rms_eps,
            )
            residual = f"/l{i}/res_in"
        else:
            node(
                "SimplifiedLayerNormalization",
                [
                    residual,
                    weight(f"{p}.input_layernorm.weight", get(f"{p}.input_layernorm.weight")),
                ],
                [x],
                f"/model/layers.{i}/input_layernorm/LayerNorm",
                epsilon=geo.rms_eps,
                axis=-1,
            )
        qkv = np.concatenate(
            [get(f"{p}.self_attn.{n}_proj.weight") for n in ("q", "k", "v")], axis=0
        ).T  # [d, (H + 2 H_kv) D]
        node(
            "MatMul",
            [x, weight(f"{p}.self_attn.qkv_proj.weight", qkv)],
            [f"/l{i}/qkv"],
            f"/model/layers.{i}/attn/qkv_proj/MatMul",
        )
        node(
            "GroupQueryAttention",
            [
                f"/l{i}/qkv",
                "",
                "",
                f"past_key_values.{i}.key",
                f"past_key_values.{i}.value",
                "seqlens_k",
                "total_len",
                "cos_cache",
                "sin_cache",
                "position_ids",
            ],
            [f"/l{i}/attn", f"present.{i}.key", f"present.{i}.value"],
            f"/model/layers.{i}/attn/GroupQueryAttention",
            num_heads=geo.heads,
            kv_num_heads=geo.kv_heads,
            scale=1.0 / math.sqrt(geo.head_dim),
            do_rotary=1,
            rotary_interleaved=0,
            local_window_size=-1,
        )
        node(
            "MatMul",
            [
                f"/l{i}/attn",
                weight(f"{p}.self_attn.o_proj.weight", get(f"{p}.self_attn.o_proj.weight").T),
            ],
            [f"/l{i}/attn_out"],
            f"/model/layers.{i}/attn/o_proj/MatMul",
        )
        node(
            "SkipSimplifiedLayerNormalization",
            [
                f"/l{i}/attn_out",
                residual,
                weight(
                    f"{p}.post_attention_layernorm.weight",
                    get(f"{p}.post_attention_layernorm.weight"),
                ),
            ],
            [f"/l{i}/post_norm", "", "", f"/l{i}/res_mid"],
            f"/model/layers.{i}/post_attention_layernorm/SkipLayerNorm",
            epsilon=geo.rms_eps,
        )
        residual = f"/l{i}/res_mid"
        for proj in ("gate", "up"):
            node(
                "MatMul",
                [
                    f"/l{i}/post_norm",
                    weight(f"{p}.mlp.{proj}_proj.weight", get(f"{p}.mlp.{proj}_proj.weight").T),
                ],
                [f"/l{i}/{proj}"],
                f"/model/layers.{i}/mlp/{proj}_proj/MatMul",
            )
        node("Sigmoid", [f"/l{i}/gate"], [f"/l{i}/gate_sig"], f"/model/layers.{i}/mlp/act/Sigmoid")
        node(
            "Mul",
            [f"/l{i}/gate", f"/l{i}/gate_sig"],
            [f"/l{i}/silu"],
            f"/model/layers.{i}/mlp/act/Mul",
        )
        node("Mul", [f"/l{i}/silu", f"/l{i}/up"], [f"/l{i}/gated"], f"/model/layers.{i}/mlp/Mul")
        node(
            "MatMul",
            [
                f"/l{i}/gated",
                weight(f"{p}.mlp.down_proj.weight", get(f"{p}.mlp.down_proj.weight").T),
            ],
            [f"/l{i}/mlp_out"],
            f"/model/layers.{i}/mlp/down_proj/MatMul",
        )
        pending = f"/l{i}/mlp_out"
    node(
        "SkipSimplifiedLayerNormalization",
        [pending, residual, weight("model.norm.weight", get("model.norm.weight"))],
        ["/final_norm", "", "", "/final_res"],
        "/model/norm/SkipLayerNorm",
        epsilon=geo.rms_eps,
    )
    node(
        "MatMul",
        ["/final_norm", weight("lm_head.weight", lm_head.T)],
        ["logits"],
        "/lm_head/MatMul",
    )

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_in: list[str | int | None] = ["batch", geo.kv_heads, "past_sequence", geo.head_dim]
    kv_out: list[str | int | None] = ["batch", geo.kv_heads, "present_sequence", geo.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", i64, ["batch", "total_sequence"]),
        helper.make_tensor_value_info("position_ids", i64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "sequence", geo.vocab])]
    for i in range(geo.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f32, kv_in))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f32, kv_out))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializer=inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="edgeinfer",
    )
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.save(model, str(out_path))
