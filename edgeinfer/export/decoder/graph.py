"""Decoders -> one ONNX graph with ONNX Runtime's fused decoder ops.

Why this route (and not optimum-onnx's ``text-generation-with-past`` or torch.onnx): those
graphs concatenate ``past`` and the new keys into a fresh ``present`` tensor every token, so the
whole cache is copied per token and cannot be written in place. Here the graph is written
directly from the weights, as onnxruntime-genai's model builder does, with
``GroupQueryAttention`` (rotary embedding inside, KV appended in place when ``past`` and
``present`` share one buffer, a sliding window per layer), ``SkipSimplifiedLayerNormalization``
(RMSNorm fused with the residual add) and one packed QKV ``MatMul`` per layer. Plain
``onnxruntime`` runs it (no onnxruntime-genai at run time) and every ``MatMul`` weight is a
``[K, N]`` initializer that the int8/int4 quantizers understand. What differs between families
(Llama, Mistral, Qwen 2/3, Gemma 1/2/3, Phi-3) is read in ``families.py``.

Graph I/O (batch B, new tokens S, KV buffer length P, mask length T, logits kept R)::

    input_ids [B, S] int64, attention_mask [B, T] int64, position_ids [B, S] int64,
    logits_to_keep [1] int64 (R), extra_row [1] int64 (1, or 0 for batched one-token steps),
    past_key_values.{i}.key|value [B, H_kv, P, D] float32
    -> logits [B, R, V] float32, next_tokens [B, R] int64 (their argmax),
       present.{i}.key|value [B, H_kv, max(P, T), D] float32

The mask's ones mark the positions in use (their count is the valid length, which
``GroupQueryAttention`` reads); it may run longer than them with zeros, so a runtime binds one
mask for the whole cache. ``GroupQueryAttention`` is fed one row more than the new tokens (the
last one repeated, writing its keys/values one position past the valid length, where the next
step writes): onnxruntime computes a single query row with another float summation order than
several rows, and an int8-activation model amplifies that 1e-7 into logits that differ by ~0.5,
so a one-token step and a many-token verification of drafted tokens would choose different
greedy tokens at near-ties. With two rows or more everywhere, every position's logits and
keys/values are the same bits however the tokens are grouped into runs (so ``present`` holds
one position more than the mask: the cache needs one spare position). ``extra_row`` 0 turns the
extra row off: onnxruntime's ``GroupQueryAttention`` refuses a batch of several sequences with
more than one new row, so a batched decode step (one token for each of several sequences, see
``runtime/generate/engine.py``) runs the plain single row, the same computation for every
sequence of the batch.

Logits are computed for the last R new positions only: a prompt needs its last row, a
verification of drafted tokens every row; greedy decoding reads ``next_tokens`` and never
copies the logits out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.errors import ConversionError
from edgeinfer.export.decoder.families import (
    SUPPORTED_FAMILIES,
    DecoderGeometry,
    canonical_state,
    rope_tables,
)
from edgeinfer.export.package import save_graph

__all__ = ["SUPPORTED_FAMILIES", "DecoderGeometry", "build_graph"]

# GroupQueryAttention, SkipSimplifiedLayerNormalization, FastGelu and MatMulNBits live in ORT's
# contrib domain; opset 17 for the ONNX domain is what onnxruntime >= 1.14 runs.
_OPSET = 17
_CONTRIB = frozenset(
    {"GroupQueryAttention", "SkipSimplifiedLayerNormalization", "FastGelu", "Gelu"}
)


class _Graph:
    """Nodes and initializers of the graph being written, with the weights it reads."""

    def __init__(self, state: dict[str, np.ndarray], geo: DecoderGeometry, half_kv: bool) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.state, self.geo = state, geo
        self.half_kv = half_kv  # attention and its KV cache in float16
        self.inits: list[Any] = []
        self.nodes: list[Any] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def get(self, key: str) -> np.ndarray:
        if key not in self.state:
            raise ConversionError(f"the source weights have no {key}")
        return self.state[key]

    def norm_weight(self, key: str) -> str:
        """An RMSNorm weight, with Gemma's ``(1 + w)`` folded in."""
        return self.const(key, (self.get(key) + self.geo.norm_offset).astype(np.float32))

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> str:
        domain = "com.microsoft" if op in _CONTRIB else ""
        self.nodes.append(
            self.helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs)
        )
        return outputs[0]

    def linear(self, x: str, keys: list[str], out: str, name: str) -> str:
        """``x @ W.T (+ b)`` for the concatenated rows of ``keys`` (transformers' Linear
        weights [out, in]); the bias is added when the source has one. The initializers are
        named after the node: ``{name}.weight`` [in, out] and ``{name}.bias``."""
        w = np.concatenate([self.get(f"{k}.weight") for k in keys], axis=0).T  # [in, out]
        y = self.node(
            "MatMul",
            [x, self.const(f"{name}.weight", w.astype(np.float32))],
            [out],
            f"{name}/MatMul",
        )
        biases = [self.state.get(f"{k}.bias") for k in keys]
        if all(b is None for b in biases):
            return y
        rows = [
            b if b is not None else np.zeros(self.get(f"{k}.weight").shape[0], np.float32)
            for b, k in zip(biases, keys, strict=True)
        ]
        bias = self.const(f"{name}.bias", np.concatenate(rows).astype(np.float32))
        return self.node("Add", [y, bias], [f"{out}_b"], f"{name}/Add")

    def rms(self, x: str, key: str, out: str, name: str) -> str:
        return self.node(
            "SimplifiedLayerNormalization",
            [x, self.norm_weight(key)],
            [out],
            f"{name}/LayerNorm",
            epsilon=self.geo.rms_eps,
            axis=-1,
        )

    def skip_rms(self, x: str, residual: str, key: str, out: str, name: str) -> tuple[str, str]:
        """RMSNorm of ``x + residual``; returns (normed, the sum)."""
        self.node(
            "SkipSimplifiedLayerNormalization",
            [x, residual, self.norm_weight(key)],
            [out, "", "", f"{out}_sum"],
            f"{name}/SkipLayerNorm",
            epsilon=self.geo.rms_eps,
        )
        return out, f"{out}_sum"


def _attention(g: _Graph, i: int, x: str) -> str:
    from onnx import TensorProto

    geo, p, n = g.geo, f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
    qkv = g.linear(x, [f"{p}.q_proj", f"{p}.k_proj", f"{p}.v_proj"], f"/l{i}/qkv", f"{n}/qkv_proj")
    qkv_in = [qkv, "", ""]
    if geo.qk_norm:  # RMSNorm over each head of q and k, before the rotary
        q_width, kv_width = geo.heads * geo.head_dim, geo.kv_heads * geo.head_dim
        split = g.const(f"/l{i}/qkv_split", np.array([q_width, kv_width, kv_width], np.int64))
        g.node("Split", [qkv, split], [f"/l{i}/q", f"/l{i}/k", f"/l{i}/v"], f"{n}/Split", axis=-1)
        qkv_in = [
            _head_norm(g, f"/l{i}/q", f"{p}.q_norm.weight", f"{n}/q_norm"),
            _head_norm(g, f"/l{i}/k", f"{p}.k_norm.weight", f"{n}/k_norm"),
            f"/l{i}/v",
        ]
    qkv_in = [_extra_row(g, x, f"{n}/ExtraRow{k}") if x else x for k, x in enumerate(qkv_in)]
    if g.half_kv:  # GroupQueryAttention computes in its cache's type
        qkv_in = [
            _cast(g, x, TensorProto.FLOAT16, f"{n}/ToHalf{k}") if x else x
            for k, x in enumerate(qkv_in)
        ]
    window = geo.windows[i] if geo.windows else -1
    cache = "local" if geo.rope_local is not None and window > 0 else "global"
    attrs: dict[str, Any] = {"softcap": geo.attn_softcap} if geo.attn_softcap else {}
    g.node(
        "GroupQueryAttention",
        [
            *qkv_in,
            f"past_key_values.{i}.key",
            f"past_key_values.{i}.value",
            "seqlens_k",
            "total_len",
            f"cos_cache_{cache}",
            f"sin_cache_{cache}",
            "position_ids_extra",
        ],
        [f"/l{i}/attn_extra", f"present.{i}.key", f"present.{i}.value"],
        f"{n}/GroupQueryAttention",
        num_heads=geo.heads,
        kv_num_heads=geo.kv_heads,
        scale=geo.attn_scale,
        do_rotary=1,
        rotary_interleaved=0,
        local_window_size=window,
        **attrs,
    )
    attn = f"/l{i}/attn_extra"
    if g.half_kv:
        attn = _cast(g, attn, TensorProto.FLOAT, f"{n}/ToFloat")
    g.node(
        "Slice",
        [attn, "zero_i64", "new_rows", "axes_1"],
        [f"/l{i}/attn"],
        f"{n}/DropExtraRow",
    )
    return g.linear(f"/l{i}/attn", [f"{p}.o_proj"], f"/l{i}/attn_out", f"{n}/o_proj")


def _cast(g: _Graph, x: str, to: int, name: str) -> str:
    return g.node("Cast", [x], [f"{name}/out"], name, to=to)


def _extra_row(g: _Graph, x: str, name: str) -> str:
    """``x`` [B, S, W] with its last row repeated: [B, S + 1, W]."""
    return g.node("Pad", [x, "extra_row_pads"], [f"{name}/out"], name, mode="edge")


def _head_norm(g: _Graph, x: str, key: str, name: str) -> str:
    """RMSNorm over the last axis of ``x`` [B, S, H*D] seen as [B, S, H, D]."""
    heads = g.const(f"{name}/shape", np.array([0, 0, -1, g.geo.head_dim], np.int64))
    flat = g.const(f"{name}/flat", np.array([0, 0, -1], np.int64))
    g.node("Reshape", [x, heads], [f"{name}/heads"], f"{name}/Reshape")
    g.rms(f"{name}/heads", key, f"{name}/normed", name)
    return g.node("Reshape", [f"{name}/normed", flat], [f"{name}/out"], f"{name}/ReshapeBack")


def _mlp(g: _Graph, i: int, x: str) -> str:
    p, n = f"model.layers.{i}.mlp", f"/model/layers.{i}/mlp"
    gate = g.linear(x, [f"{p}.gate_proj"], f"/l{i}/gate", f"{n}/gate_proj")
    up = g.linear(x, [f"{p}.up_proj"], f"/l{i}/up", f"{n}/up_proj")
    act = f"/l{i}/act"
    if g.geo.activation == "silu":
        g.node("Sigmoid", [gate], [f"/l{i}/gate_sig"], f"{n}/act/Sigmoid")
        g.node("Mul", [gate, f"/l{i}/gate_sig"], [act], f"{n}/act/Mul")
    else:  # tanh-approximated GELU (Gemma's GeGLU) or the exact erf one
        g.node(
            "FastGelu" if g.geo.activation == "gelu_tanh" else "Gelu",
            [gate],
            [act],
            f"{n}/act/Gelu",
        )
    g.node("Mul", [act, up], [f"/l{i}/gated"], f"{n}/Mul")
    return g.linear(f"/l{i}/gated", [f"{p}.down_proj"], f"/l{i}/mlp_out", f"{n}/down_proj")


def _inputs(g: _Graph) -> str:
    """Embedding lookup (scaled for Gemma), the rotary tables and GQA's length inputs."""
    from onnx import TensorProto

    geo = g.geo
    embed = g.const("model.embed_tokens.weight", g.get("model.embed_tokens.weight"))  # [V, d]
    for kind, spec in (("global", geo.rope), ("local", geo.rope_local)):
        if spec is not None:
            # Two rows past the context: GroupQueryAttention checks the tables against its
            # total length, the runtime's mask (the cache, one spare position) plus the extra row.
            cos, sin = rope_tables(spec, geo.context_length + 2)
            dtype = np.float16 if g.half_kv else np.float32  # GroupQueryAttention's type
            g.const(f"cos_cache_{kind}", cos.astype(dtype))
            g.const(f"sin_cache_{kind}", sin.astype(dtype))
    g.const("axes_1", np.array([1], np.int64))
    g.const("one_scalar_i64", np.array(1, np.int64))
    g.const("idx_1", np.array(1, np.int64))
    x = g.node("Gather", [embed, "input_ids"], ["embeds"], "/embed/Gather")
    if geo.embed_scale is not None:  # in the weights' dtype, as transformers does
        scale = g.const("embed_scale", np.array(geo.embed_scale, np.float32))
        x = g.node("Mul", [x, scale], ["embeds_scaled"], "/embed/Mul")
    # GroupQueryAttention sees the new tokens plus the last one repeated (see the module's
    # docstring), so its lengths count one position more than the mask's:
    # seqlens_k: [B] int32 = valid length + 1 - 1; total_sequence_length: scalar int32 =
    # max(T, valid length + 1): a bound within the runtime's cache buffer (T, its length,
    # holds the spare position), exact for a graph run without one (an empty past).
    # ``extra_row`` 0: no extra row (batched one-token steps; see the module's docstring).
    g.const("zero_i64", np.array([0], np.int64))
    for pads, zeros, tail in (("extra_row_pads", 4, ["zero_i64"]), ("extra_position_pads", 3, [])):
        lead = g.const(f"zeros_{zeros}_i64", np.zeros(zeros, np.int64))
        g.node("Concat", [lead, "extra_row", *tail], [pads], f"/extra/{pads}", axis=0)
    g.node("Squeeze", ["extra_row"], ["extra_rows"], "/extra/Squeeze")
    g.node("Sub", ["extra_rows", "one_scalar_i64"], ["extra_minus_one"], "/extra/Sub")
    g.node("Shape", ["input_ids"], ["ids_shape"], "/extra/Shape")
    g.node("Gather", ["ids_shape", "axes_1"], ["new_rows"], "/extra/NewRows", axis=0)
    g.node("ReduceSum", ["attention_mask", "axes_1"], ["mask_sum"], "/mask/ReduceSum", keepdims=0)
    g.node("Add", ["mask_sum", "extra_minus_one"], ["seqlens_64"], "/mask/SeqLens")
    g.node("Cast", ["seqlens_64"], ["seqlens_k"], "/mask/Cast", to=TensorProto.INT32)
    g.node("Shape", ["attention_mask"], ["mask_shape"], "/mask/Shape")
    g.node("Gather", ["mask_shape", "idx_1"], ["mask_len"], "/mask/Gather", axis=0)
    g.node("ReduceMax", ["mask_sum"], ["valid_max"], "/mask/ReduceMax", keepdims=0)
    g.node("Add", ["valid_max", "extra_rows"], ["needed"], "/mask/Add")
    g.node("Max", ["mask_len", "needed"], ["total_64"], "/mask/Max")
    g.node("Cast", ["total_64"], ["total_len"], "/mask/CastTotal", to=TensorProto.INT32)
    g.node(
        "Pad",
        ["position_ids", "extra_position_pads"],
        ["position_ids_extra"],
        "/pos/ExtraRow",
        mode="edge",
    )
    return x


def _last_rows(g: _Graph, hidden: str) -> str:
    """``hidden`` [B, S, d] cut to its last ``logits_to_keep`` positions [B, R, d]."""
    end = g.const("/logits/end", np.array([np.iinfo(np.int64).max], np.int64))
    g.node("Neg", ["logits_to_keep"], ["/logits/start"], "/logits/Neg")
    return g.node("Slice", [hidden, "/logits/start", end, "axes_1"], ["/kept"], "/logits/Slice")


def build_graph(
    state: dict[str, np.ndarray], geo: DecoderGeometry, out_path: Path, *, kv_dtype: str = "float32"
) -> None:
    """Write the fp32 decoder graph for the transformers ``state`` dict (numpy arrays); with
    ``kv_dtype`` "float16" attention runs in float16 over a half-size KV cache."""
    from onnx import TensorProto, helper

    g = _Graph(canonical_state(state, geo), geo, half_kv=kv_dtype == "float16")
    residual, pending = _inputs(g), ""  # pending: the block output not yet added to residual
    for i in range(geo.layers):
        p, n = f"model.layers.{i}", f"/model/layers.{i}"
        if pending:
            x, residual = g.skip_rms(
                pending,
                residual,
                f"{p}.input_layernorm.weight",
                f"/l{i}/in_norm",
                f"{n}/input_layernorm",
            )
        else:
            x = g.rms(
                residual, f"{p}.input_layernorm.weight", f"/l{i}/in_norm", f"{n}/input_layernorm"
            )
        attn = _attention(g, i, x)
        if geo.sandwich:  # Gemma 2/3: norm the block outputs before each residual add
            attn = g.rms(
                attn,
                f"{p}.post_attention_layernorm.weight",
                f"/l{i}/attn_normed",
                f"{n}/post_attention_layernorm",
            )
            y, residual = g.skip_rms(
                attn,
                residual,
                f"{p}.pre_feedforward_layernorm.weight",
                f"/l{i}/post_norm",
                f"{n}/pre_feedforward_layernorm",
            )
            pending = g.rms(
                _mlp(g, i, y),
                f"{p}.post_feedforward_layernorm.weight",
                f"/l{i}/mlp_normed",
                f"{n}/post_feedforward_layernorm",
            )
        else:
            y, residual = g.skip_rms(
                attn,
                residual,
                f"{p}.post_attention_layernorm.weight",
                f"/l{i}/post_norm",
                f"{n}/post_attention_layernorm",
            )
            pending = _mlp(g, i, y)
    final, _ = g.skip_rms(pending, residual, "model.norm.weight", "/final_norm", "/model/norm")
    final = _last_rows(g, final)
    # A tied lm_head is its own [d, V] copy, quantized separately from the embedding table.
    head = g.state.get("lm_head.weight", g.get("model.embed_tokens.weight"))
    logits = "logits_raw" if geo.final_softcap else "logits"
    g.node(
        "MatMul",
        [final, g.const("lm_head.weight", head.T.astype(np.float32))],
        [logits],
        "/lm_head/MatMul",
    )
    if geo.final_softcap:  # cap * tanh(logits / cap)
        cap = g.const("final_softcap", np.array(geo.final_softcap, np.float32))
        g.node("Div", [logits, cap], ["logits_div"], "/softcap/Div")
        g.node("Tanh", ["logits_div"], ["logits_tanh"], "/softcap/Tanh")
        g.node("Mul", ["logits_tanh", cap], ["logits"], "/softcap/Mul")
    g.node("ArgMax", ["logits"], ["next_tokens"], "/logits/ArgMax", axis=-1, keepdims=0)

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    kv_in: list[str | int | None] = ["batch", geo.kv_heads, "past_sequence", geo.head_dim]
    kv_out: list[str | int | None] = ["batch", geo.kv_heads, "present_sequence", geo.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", i64, ["batch", "total_sequence"]),
        helper.make_tensor_value_info("position_ids", i64, ["batch", "sequence"]),
        helper.make_tensor_value_info("logits_to_keep", i64, [1]),
        helper.make_tensor_value_info("extra_row", i64, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", f32, ["batch", "kept", geo.vocab]),
        helper.make_tensor_value_info("next_tokens", i64, ["batch", "kept"]),
    ]
    for i in range(geo.layers):
        for kind in ("key", "value"):
            kv = TensorProto.FLOAT16 if g.half_kv else f32
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", kv, kv_in))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", kv, kv_out))
    graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="edgeinfer",
    )
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    save_graph(model, out_path)
