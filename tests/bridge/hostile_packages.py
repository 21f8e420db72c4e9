"""Packages a compromised build machine could sign: valid manifests, every sha256 right, graphs
that never finish or allocate far past any limit when they are warmed up, and a generate
package whose ``tokenizer.model`` is garbage. Built from the fast lane's tiny encoder (no torch,
no export), plus a benign tiny encoder that carries smoke cases (the default deploy check
refuses a package without them).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnx
from fast_packages import tiny_encoder
from onnx import TensorProto, helper

import edgeinfer
from edgeinfer.manifest import Manifest, file_entries
from edgeinfer.runtime import smoke

TEXTS = ["pump pressure rising", "valve closed", "motor vibration high"]
ENDLESS_TRIPS = 2**62  # a Loop's trip count no device finishes (each trip is microseconds)


def benign_encoder(folder: Path, *, seed: int = 0) -> Path:
    """The tiny encoder with smoke cases recorded from its own outputs."""
    tiny_encoder(folder, seed=seed)
    with edgeinfer.load(folder, config=edgeinfer.RuntimeConfig(spin_wait=False)) as model:
        field, _ = smoke.record(model, TEXTS)
    replace(Manifest.read(folder), smoke=field).write(folder)
    return folder


def _with_graph_tail(folder: Path, nodes: list[onnx.NodeProto], *, seed: int) -> Path:
    """The benign encoder whose ``Tanh`` output (``hidden``) goes through ``nodes``, which
    must end in ``last_hidden_state``; the manifest lists the new graph's sha256."""
    benign_encoder(folder, seed=seed)
    model = onnx.load(str(folder / "model.onnx"))
    graph = model.graph
    for node in graph.node:
        if node.op_type == "Tanh":
            node.output[0] = "hidden"
    graph.node.extend(nodes)
    onnx.save(model, str(folder / "model.onnx"))
    manifest = Manifest.read(folder)
    files = {**manifest.files, **file_entries(folder, ["model.onnx"])}
    replace(manifest, files=files).write(folder)
    return folder


def endless_encoder(folder: Path, *, seed: int = 1) -> Path:
    """Its graph ends in a ``Loop`` of ``ENDLESS_TRIPS`` trips whose condition stays true:
    ``load`` never returns from its warm-up."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["carried_in"], ["carried_out"]),
        ],
        "forever",
        [
            helper.make_tensor_value_info("trip", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried_out", TensorProto.FLOAT, None),
        ],
    )
    trips = helper.make_tensor("t", TensorProto.INT64, [], [ENDLESS_TRIPS])
    nodes = [
        helper.make_node("Constant", [], ["trips"], value=trips),
        helper.make_node(
            "Constant", [], ["always"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])
        ),
        helper.make_node("Loop", ["trips", "always", "hidden"], ["last_hidden_state"], body=body),
    ]
    return _with_graph_tail(folder, nodes, seed=seed)


def memory_bomb_encoder(folder: Path, *, bomb_bytes: int, seed: int = 2) -> Path:
    """Its graph fills a float tensor of ``bomb_bytes`` (sized from the input's batch, so
    onnxruntime cannot fold it away at load) and adds its sum to the output: the warm-up
    allocates and touches all of it."""
    floats = bomb_bytes // 4
    scale = helper.make_tensor("k", TensorProto.INT64, [1], [floats])
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["ids_shape"], start=0, end=1),  # [B]
        helper.make_node("Constant", [], ["scale"], value=scale),
        helper.make_node("Mul", ["ids_shape", "scale"], ["bomb_shape"]),
        helper.make_node(
            "ConstantOfShape",
            ["bomb_shape"],
            ["bomb"],
            value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("ReduceSum", ["bomb"], ["bomb_sum"], keepdims=0),
        helper.make_node(
            "Constant", [], ["zero"], value=helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])
        ),
        helper.make_node("Mul", ["bomb_sum", "zero"], ["nothing"]),
        helper.make_node("Add", ["hidden", "nothing"], ["last_hidden_state"]),
    ]
    return _with_graph_tail(folder, nodes, seed=seed)
