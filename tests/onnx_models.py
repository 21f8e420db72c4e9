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


def _save(graph: object, path: Path, *, opset: int = 17, external: bool = False) -> Path:
    """Save ``graph`` at ``opset``; ``external``: every weight (initializers and ``Constant``
    nodes' values) in ``<name>.data`` beside it."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset >= 15 else 7
    onnx.checker.check_model(model)
    onnx.save(model, path, save_as_external_data=external, location=f"{path.name}.data",
              size_threshold=64, convert_attribute=True)  # fmt: skip
    return path


def yolo_like(
    path: Path, *, classes: int = 3, size: int = 8, boxes: tuple[float, ...] = (100, 1000, 10, 60)
) -> Path:
    """A YOLOv8-layout detector: images [1, 3, size, size] -> output0 [1, 4+C, size^2], one
    anchor per pixel: cx, cy = boxes[0] x R, G + boxes[1], w = h = boxes[2] x B + boxes[3], class
    k's logit 4 x channel k - 2. One MatMul makes box coordinates in pixels (hundreds, by
    default) and class logits (units) in the same tensor, so a per-tensor int8 scale fit to
    the boxes rounds the logits away while the whole output's relative L2 stays small (what
    quantized YOLO exports do)."""
    from onnx import TensorProto, helper, numpy_helper

    attributes, anchors = 4 + classes, size * size
    spread, centre, grow, least = boxes
    weight = np.zeros((3, attributes), np.float32)
    weight[0, 0], weight[1, 1], weight[2, 2], weight[2, 3] = spread, spread, grow, grow
    weight[:, 4:] = np.eye(3, classes, dtype=np.float32) * 4.0
    bias = np.array([centre, centre, least, least] + [-2.0] * classes, np.float32)
    starts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              [("s0", [0]), ("s4", [4]), ("s_end", [attributes]), ("axis", [2])]]  # fmt: skip
    nodes = [
        helper.make_node("Reshape", ["images", "flat"], ["pixels"]),  # [1, 3, 64]
        helper.make_node("Transpose", ["pixels"], ["anchors"], perm=[0, 2, 1]),  # [1, 64, 3]
        helper.make_node("MatMul", ["anchors", "W"], ["mixed"]),
        helper.make_node("Add", ["mixed", "B"], ["raw"]),  # [1, 64, 4+C]
        helper.make_node("Slice", ["raw", "s0", "s4", "axis"], ["boxes"]),
        helper.make_node("Slice", ["raw", "s4", "s_end", "axis"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["joined"], axis=2),
        helper.make_node("Transpose", ["joined"], ["output0"], perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "yolo_like",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, attributes, anchors])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(bias, "B"),
            numpy_helper.from_array(np.array([1, 3, anchors], np.int64), "flat"),
            *starts,
        ],
    )
    return _save(graph, path)


def ocr_like(
    path: Path,
    *,
    classes: int = 40,
    opset: int = 17,
    external: bool = False,
    time_major: bool = False,
    constant_weights: bool = False,
) -> Path:
    """A CTC text recognizer: a line image [1, 1, 8, W] of any width -> per-column class logits
    [1, W, C] (class 0 the blank). Column k of the one-hot image is class k with a margin of 6;
    the last class's logits are -50 x the column sum, so a per-tensor int8 scale made for them
    moves every other logit by a large share of its own size while no argmax changes. ``opset``
    below 13 writes Squeeze's axes as an attribute (as Paddle's opset 11 exports do);
    ``time_major`` gives [W, 1, C] (PyTorch CRNNs' CTC order, as ddddocr's recognizer);
    ``constant_weights`` keeps the weights in a ``Constant`` node (as Paddle's exports do)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.zeros((8, classes), np.float32)
    weight[:, :8] = np.eye(8, dtype=np.float32) * 6.0
    weight[:, -1] = -50.0
    squeeze = (
        helper.make_node("Squeeze", ["image", "channel"], ["rows"])
        if opset >= 13
        else helper.make_node("Squeeze", ["image"], ["rows"], axes=[1])
    )  # [1, 8, W]
    constant = helper.make_node("Constant", [], ["W"], value=numpy_helper.from_array(weight, "W"))
    graph = helper.make_graph(
        [
            *([constant] if constant_weights else []),
            squeeze,
            helper.make_node("Transpose", ["rows"], ["columns"], perm=[0, 2, 1]),  # [1, W, 8]
            helper.make_node("MatMul", ["columns", "W"], ["scores" if time_major else "logits"]),
            *(
                [helper.make_node("Transpose", ["scores"], ["logits"], perm=[1, 0, 2])]
                if time_major
                else []
            ),
        ],
        "ocr_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 8, "width"])],
        [
            helper.make_tensor_value_info(
                "logits",
                TensorProto.FLOAT,
                ["width", 1, classes] if time_major else [1, "width", classes],
            )
        ],
        initializer=[
            *([] if constant_weights else [numpy_helper.from_array(weight, "W")]),
            *([numpy_helper.from_array(np.array([1], np.int64), "channel")] if opset >= 13 else []),
        ],
    )
    return _save(graph, path, opset=opset, external=external)


def ocr_lines(folder: Path, *, widths: tuple[int, ...], seed: int = 0) -> Path:
    """Line images of the given widths, one .npz per line: column j one-hot at a random row
    (its class), plus small positive noise."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index, width in enumerate(widths):
        image = rng.uniform(0, 0.05, size=(1, 1, 8, width)).astype(np.float32)
        image[0, 0, rng.integers(0, 8, size=width), np.arange(width)] += 1.0
        np.savez(folder / f"line-{index:02d}.npz", image=image)
    return folder


def padded_encoder(path: Path, *, length: int = 16, dim: int = 8, vocab: int = 32) -> Path:
    """A text encoder with a fixed-length input: input_ids and attention_mask [1, length] int64
    -> last_hidden_state [1, length, dim] (an embedding table and one MatMul)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    weight = rng.normal(size=(dim, dim)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["tokens"]),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
            helper.make_node("MatMul", ["tokens", "W"], ["states"]),
            helper.make_node("Mul", ["states", "mask3"], ["last_hidden_state"]),
        ],
        "padded_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, length]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, length]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, length, dim])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(np.array([2], np.int64), "last"),
        ],
    )
    return _save(graph, path)


def softmax_classifier(path: Path, *, classes: int = 3) -> Path:
    """An image classifier that already outputs probabilities: images [N, 3, 8, 8] -> pooled
    -> Gemm -> Softmax -> probs [N, C]."""
    from onnx import TensorProto, helper, numpy_helper

    weight = (np.arange(3 * classes, dtype=np.float32).reshape(3, classes) - 4.0) * 2.0
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("Gemm", ["flat", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
        ],
        "softmax_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", classes])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    return _save(graph, path)


def yolox_like(path: Path, *, classes: int = 2, size: int = 32) -> Path:
    """A YOLOX head as its export writes it: images [1, 3, size, size] -> output [1, N, 5+C],
    one anchor per cell of the stride 8, 16 and 32 grids (each cell's mean pixel), boxes still
    relative to their cells: centre offsets 0.5, log width and height 4 x B - 2 (negative on
    dark cells), objectness sigmoid(4 x R - 1), class k's sigmoid(4 x channel k - 2), on
    channels as 0-1 (the graph takes 0-255 values, as YOLOX's export does)."""
    from onnx import TensorProto, helper, numpy_helper

    attributes = 5 + classes
    grids = [(size // s) ** 2 for s in (8, 16, 32)]
    weight = np.zeros((3, attributes), np.float32)
    weight[2, 2], weight[2, 3], weight[0, 4] = 4.0, 4.0, 4.0
    weight[:, 5:] = np.eye(3, classes, dtype=np.float32) * 4.0
    weight /= 255.0
    bias = np.array([0.5, 0.5, -2.0, -2.0, -1.0] + [-2.0] * classes, np.float32)
    nodes, shapes = [], []
    for stride, cells in zip((8, 16, 32), grids, strict=True):
        nodes += [
            helper.make_node(
                "AveragePool",
                ["images"],
                [f"p{stride}"],
                kernel_shape=[stride] * 2,
                strides=[stride] * 2,
            ),
            helper.make_node("Reshape", [f"p{stride}", f"shape{stride}"], [f"f{stride}"]),
        ]
        shapes.append(numpy_helper.from_array(np.array([1, 3, cells], np.int64), f"shape{stride}"))
    nodes += [
        helper.make_node("Concat", ["f8", "f16", "f32"], ["cells"], axis=2),  # [1, 3, N]
        helper.make_node("Transpose", ["cells"], ["anchors"], perm=[0, 2, 1]),  # [1, N, 3]
        helper.make_node("MatMul", ["anchors", "W"], ["mixed"]),
        helper.make_node("Add", ["mixed", "B"], ["raw"]),  # [1, N, 5+C]
        helper.make_node("Sigmoid", ["raw"], ["squashed"]),
        helper.make_node("Split", ["raw", "split"], ["box_raw", "rest_raw"], axis=2),
        helper.make_node("Split", ["squashed", "split"], ["unused", "scores"], axis=2),
        helper.make_node("Concat", ["box_raw", "scores"], ["output"], axis=2),
    ]
    graph = helper.make_graph(
        nodes,
        "yolox_like",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, sum(grids), attributes])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(bias, "B"),
            numpy_helper.from_array(np.array([4, attributes - 4], np.int64), "split"),
            *shapes,
        ],
    )
    return _save(graph, path)


def text_map(path: Path) -> Path:
    """A DB-style text detector as PP-OCR's: images [1, 3, H, W] of any size -> a probability
    map [1, 1, H, W] (a 3x3 convolution, then a sigmoid); convolutions only."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).normal(size=(1, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W"], ["maps"], pads=[1, 1, 1, 1]),
            helper.make_node("Sigmoid", ["maps"], ["probability"]),
        ],
        "text_map",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, [1, 1, "h", "w"])],
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    return _save(graph, path)


def one_sensitive_node(path: Path, *, classes: int = 3) -> Path:
    """x [N, 4, 1, 1] -> 1x1 Conv ``wide`` (identity) -> 1x1 Conv ``head`` -> Flatten ->
    logits [N, classes]. ``head``'s filters weigh input channel 0 by 1000 and the channels that
    carry the classes by 0.3: per-channel int8 weights round the 0.3 to zero, so int8 agrees
    with fp32 only with ``head`` in float. Feed x with channel 0 at zero (``head`` then
    outputs small logits, whose own rounding is fine)."""
    from onnx import helper, numpy_helper

    wide = np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1)
    head = np.zeros((classes, 4, 1, 1), np.float32)
    head[:, 0] = 1000.0
    for j in range(classes):
        head[j, 1 + j % 3] = 0.3
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W1"], ["hidden"], name="wide"),
            helper.make_node("Conv", ["hidden", "W2"], ["scores"], name="head"),
            helper.make_node("Flatten", ["scores"], ["logits"], name="flatten"),
        ],
        "one_sensitive_node",
        [helper.make_tensor_value_info("x", 1, ["n", 4, 1, 1])],
        [helper.make_tensor_value_info("logits", 1, ["n", classes])],
        initializer=[numpy_helper.from_array(wide, "W1"), numpy_helper.from_array(head, "W2")],
    )
    return _save(graph, path)


def yolo_seg_like(
    path: Path, *, classes: int = 1, coefficients: int = 4, size: int = 32,
    metadata: dict[str, str] | None = None,
) -> Path:  # fmt: skip
    """A YOLOv8-seg layout: images [1, 3, size, size] -> output0 [1, 4+C+K, size^2] (one anchor
    per pixel: cx = 32 x R, cy = 32 x G, w = h = 8 x B + 4, class k's sigmoid(4 x channel k -
    2), then K mask coefficients 3 x channel - 1.5, unbounded) and output1 mask prototypes
    [1, K, size/4, size/4] (a 1x1 convolution of the 4x4-pooled picture), as ultralytics'
    ``-seg`` exports lay them out."""
    from onnx import TensorProto, helper, numpy_helper

    attributes, anchors, side = 4 + classes + coefficients, size * size, size // 4
    weight = np.zeros((3, attributes), np.float32)
    weight[0, 0], weight[1, 1], weight[2, 2], weight[2, 3] = 32.0, 32.0, 8.0, 8.0
    weight[:, 4 : 4 + classes] = np.eye(3, classes, dtype=np.float32) * 4.0
    rng = np.random.default_rng(7)
    weight[:, 4 + classes :] = rng.normal(size=(3, coefficients)) * 3.0
    bias = np.array([0, 0, 4, 4] + [-2.0] * classes + [-1.5] * coefficients, np.float32)
    protos = (rng.normal(size=(coefficients, 3, 1, 1)) * 4.0).astype(np.float32)
    cut = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
           [("s0", [0]), ("s4", [4]), ("sc", [4 + classes]), ("s_end", [attributes]),
            ("axis", [2])]]  # fmt: skip
    nodes = [
        helper.make_node("Reshape", ["images", "flat"], ["pixels"]),
        helper.make_node("Transpose", ["pixels"], ["anchors"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["anchors", "W"], ["mixed"]),
        helper.make_node("Add", ["mixed", "B"], ["raw"]),
        helper.make_node("Slice", ["raw", "s0", "s4", "axis"], ["boxes"]),
        helper.make_node("Slice", ["raw", "s4", "sc", "axis"], ["logits"]),
        helper.make_node("Slice", ["raw", "sc", "s_end", "axis"], ["coefs"]),
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores", "coefs"], ["joined"], axis=2),
        helper.make_node("Transpose", ["joined"], ["output0"], perm=[0, 2, 1]),
        helper.make_node(
            "AveragePool", ["images"], ["pooled"], kernel_shape=[4, 4], strides=[4, 4]
        ),
        helper.make_node("Conv", ["pooled", "P"], ["output1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "yolo_seg_like",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
        [
            helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, attributes, anchors]),
            helper.make_tensor_value_info(
                "output1", TensorProto.FLOAT, [1, coefficients, side, side]
            ),
        ],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(bias, "B"),
            numpy_helper.from_array(protos, "P"),
            numpy_helper.from_array(np.array([1, 3, anchors], np.int64), "flat"),
            *cut,
        ],
    )
    return _save_with_metadata(graph, path, metadata)


def _save_with_metadata(graph: object, path: Path, metadata: dict[str, str] | None) -> Path:
    """``_save``, then the model's ``metadata_props`` (ultralytics writes task, imgsz, names)."""
    import onnx
    from onnx import helper

    _save(graph, path)
    if metadata:
        model = onnx.load(str(path))
        helper.set_model_props(model, metadata)
        onnx.save(model, str(path))
    return path


def dynamic_yolo(
    path: Path, *, classes: int = 3, metadata: dict[str, str] | None = None, sigmoid: bool = True
) -> Path:
    """``yolo_like`` as users export it with ``dynamic=True``: images [1, 3, height, width]
    of any size -> output0 [1, 4+C, anchors], one anchor per pixel, class k's sigmoid(8 x
    channel k - 5 - 0.3 k) (shape inference resolves
    ``anchors`` once the input is fixed); ``sigmoid`` False leaves the class rows as logits
    (what a head that is not a detector's holds)."""
    from onnx import TensorProto, helper, numpy_helper

    attributes = 4 + classes
    weight = np.zeros((3, attributes), np.float32)
    weight[0, 0], weight[1, 1], weight[2, 2], weight[2, 3] = 32.0, 32.0, 8.0, 8.0
    weight[:, 4:] = np.eye(3, classes, dtype=np.float32) * 8.0
    # class biases apart, so a gray pixel (R = G = B) does not tie its classes, and low enough
    # that a letterbox's gray border scores under 0.25: thousands of equal anchors would leave
    # NMS's order to the last bit of an optimized graph's arithmetic
    bias = np.array([0, 0, 4, 4] + [-5.0 - 0.3 * k for k in range(classes)], np.float32)
    nodes = [
        helper.make_node("Reshape", ["images", "flat"], ["pixels"]),  # [1, 3, H x W]
        helper.make_node("Transpose", ["pixels"], ["anchors"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["anchors", "W"], ["mixed"]),
        helper.make_node("Add", ["mixed", "B"], ["raw"]),
        helper.make_node("Split", ["raw", "split"], ["boxes", "logits"], axis=2),
        helper.make_node("Sigmoid" if sigmoid else "Identity", ["logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["joined"], axis=2),
        helper.make_node("Transpose", ["joined"], ["output0"], perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic_yolo",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "height", "width"])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, attributes, "anchors"])],
        initializer=[
            numpy_helper.from_array(weight, "W"),
            numpy_helper.from_array(bias, "B"),
            numpy_helper.from_array(np.array([1, 3, -1], np.int64), "flat"),
            numpy_helper.from_array(np.array([4, classes], np.int64), "split"),
        ],
    )
    return _save_with_metadata(graph, path, metadata)


def semantic_like(path: Path, *, classes: int = 3, size: int = 32) -> Path:
    """A per-pixel classifier: images [1, 3, size, size] -> logits [1, C, size/2, size/2]
    (a 1x1 convolution of the 2x2-pooled picture: class k leads where channel k is bright)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = (np.eye(classes, 3, dtype=np.float32) * 8.0)[:, :, None, None]
    bias = np.full(classes, -2.0, np.float32)
    graph = helper.make_graph(
        [
            helper.make_node(
                "AveragePool", ["image"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]
            ),
            helper.make_node("Conv", ["pooled", "W", "B"], ["logits"]),
        ],
        "semantic_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, [1, classes, size // 2, size // 2]
            )
        ],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")],
    )
    return _save(graph, path)


def saliency_like(path: Path, *, size: int = 32) -> Path:
    """U-2-Net's layout (rembg's u2netp): images [1, 3, size, size] -> a fused foreground
    probability map [1, 1, size, size] (Sigmoid; bright red is foreground) and a side output
    of the same shape (the inverse map: a package must read only the first)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.array([8.0, 0.0, 0.0], np.float32)[None, :, None, None]
    bias = np.full(1, -2.0, np.float32)
    shape = [1, 1, size, size]
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["image", "W", "B"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["d0"]),
            helper.make_node("Neg", ["logit"], ["inverse"]),
            helper.make_node("Sigmoid", ["inverse"], ["d1"]),
        ],
        "saliency_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [
            helper.make_tensor_value_info("d0", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("d1", TensorProto.FLOAT, shape),
        ],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")],
    )
    return _save(graph, path)
