"""Small ONNX graphs as users hold them (written with onnx.helper or exported by PyTorch), and
their data files, for the onnx-file builder's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def accumulator(path: Path) -> Path:
    """A stateful graph like a voice detector's: out = state + x @ W, stateN = out (so the
    state carries every call's input). W is a 4x4 matrix: there is a MatMul to quantize."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def value(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32) * 2.0, "W")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["state", "xw"], ["out"]),
            helper.make_node("Identity", ["out"], ["stateN"]),
        ],
        "accumulator",
        [value("x"), value("state")],
        [value("out"), value("stateN")],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def accumulator_data(path: Path, *, calls: int = 8, seed: int = 0) -> Path:
    """One stream of ``calls`` inputs x [calls, 1, 4] as a .npz file."""
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.normal(size=(calls, 1, 4)).astype(np.float32))
    return path


def tiny_cnn(path: Path, *, classes: int = 3, size: int = 32, seed: int = 0) -> Path:
    """A small CNN image classifier [N, 3, size, size] -> logits [N, classes] exported by
    PyTorch, its logits scaled so that most pictures are decided."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, classes),
    ).eval()
    with torch.no_grad():
        model[-1].weight.mul_(30.0)
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, size, size),),
        str(path),
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "n"}, "logits": {0: "n"}},
        opset_version=17,
        dynamo=False,
    )
    return path
