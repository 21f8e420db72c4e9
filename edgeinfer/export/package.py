"""Writing packages: stage the files, hash them into the manifest, then rename atomically."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest, file_entries
from edgeinfer.package_io import TensorSpec

__all__ = [
    "DATA_NAME",
    "GRAPH_NAME",
    "TOKENIZER_NAME",
    "commit",
    "external_data_files",
    "externalize",
    "node_tensors",
    "partial_path",
    "read_io",
    "save_graph",
    "stage",
]

GRAPH_NAME = "model.onnx"
DATA_NAME = "model.onnx.data"  # a graph's weights, next to it (``externalize``)
TOKENIZER_NAME = "tokenizer.json"
# Tensors start on page boundaries: onnxruntime then maps them from the file instead of
# copying them to the heap (4 KiB pages on x86-64 and most arm64 Linux; a larger page size
# only makes it copy the tensors that are not aligned to it).
_ALIGN = 4096
_EXTERNAL_MIN_BYTES = 1024
_DTYPE_NAMES = {7: "int64", 6: "int32", 1: "float32", 10: "float16"}
# protobuf refuses a message over 2 GiB: larger intermediate graphs (a 0.5B+ decoder in fp32, its
# tied lm_head a second copy of the table) keep their weights in one file beside the graph.
EXTERNAL_DATA_BYTES = 1_900_000_000


def save_graph(model: Any, path: Path) -> None:
    """Save ``model`` to ``path``; weights go to ``<path name>.data`` beside it when the graph
    would pass protobuf's 2 GiB limit."""
    import onnx

    # ModelProto.ByteSize() itself fails past 2 GiB: add up the initializers one by one.
    weight_bytes = sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer)
    if weight_bytes < EXTERNAL_DATA_BYTES:
        onnx.save(model, str(path))
        return
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=1024,
    )


def external_data_files(graph: Path) -> list[str]:
    """The files (relative to the graph's folder) that hold ``graph``'s external weights:
    of its initializers and of its nodes' tensor attributes (``Constant`` nodes: Paddle
    exports keep every weight there), subgraphs included."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sorted(
        {
            entry.value
            for tensor in _tensors(model.graph)
            for entry in tensor.external_data
            if entry.key == "location"
        }
    )


def _tensors(graph: Any) -> Iterator[Any]:
    """Every tensor of an ONNX graph: initializers, node attributes, subgraphs' tensors."""
    yield from graph.initializer
    yield from node_tensors(graph)


def node_tensors(graph: Any) -> Iterator[Any]:
    """The tensors of an ONNX graph's node attributes (``Constant`` values, ...), subgraphs'
    tensors included."""
    import onnx

    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield attribute.t
            yield from attribute.tensors
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def read_io(graph: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The graph's inputs and outputs (symbolic dims by name), for the manifest's ``io``."""
    import onnx

    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and others on a damaged file
        raise ConfigError(
            f"{graph.name} is not an ONNX model: {type(exc).__name__}: {exc}"
        ) from exc

    def describe(values: Any) -> tuple[TensorSpec, ...]:
        specs = []
        for v in values:
            t = v.type.tensor_type
            specs.append(
                TensorSpec(
                    name=v.name,
                    dtype=_DTYPE_NAMES.get(t.elem_type, str(t.elem_type)),
                    shape=tuple(d.dim_param or d.dim_value for d in t.shape.dim),
                )
            )
        return tuple(specs)

    return describe(model.graph.input), describe(model.graph.output)


def externalize(graph: Path, folder: Path) -> dict[str, Path]:
    """Write ``graph`` as ``folder/model.onnx`` with its weights in ``folder/model.onnx.data``,
    every tensor of 1 KiB or more at a page-aligned offset; returns the package files.

    onnxruntime maps aligned external tensors instead of reading them into its heap: a weight
    it prepacks costs memory once (its packed copy), and a table it only gathers from (the
    token embedding) costs the rows read.
    """
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(graph))
    folder.mkdir(parents=True, exist_ok=True)
    offset = 0
    with open(folder / DATA_NAME, "wb") as data:
        for tensor in model.graph.initializer:
            raw = tensor.raw_data
            if len(raw) < _EXTERNAL_MIN_BYTES:
                continue
            padding = -offset % _ALIGN
            data.write(b"\0" * padding)
            offset += padding
            data.write(raw)
            del tensor.external_data[:]
            for key, value in (("location", DATA_NAME), ("offset", offset), ("length", len(raw))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            tensor.data_location = TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            offset += len(raw)
    onnx.save(model, str(folder / GRAPH_NAME))
    return {GRAPH_NAME: folder / GRAPH_NAME, DATA_NAME: folder / DATA_NAME}


def _place(src: Path, dst: Path) -> None:
    """Hard-link when possible (a staged candidate costs no copy), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def stage(
    folder: Path,
    *,
    files: dict[str, Path],
    fields: dict[str, Any],
    extra_files: dict[str, bytes] | None = None,
) -> Manifest:
    """Lay out a package in ``folder``: ``files`` (package name -> built file), the
    ``extra_files`` written from bytes, and the manifest (``fields`` plus every file's sha256).
    """
    folder.mkdir(parents=True, exist_ok=False)
    for name, src in files.items():
        _place(src, folder / name)
    for name, data in (extra_files or {}).items():
        (folder / name).write_bytes(data)
    names = [*files, *(extra_files or {})]
    manifest = Manifest(**{**fields, "files": file_entries(folder, names)})
    manifest.write(folder)
    return manifest


def partial_path(out: Path) -> Path:
    """Where a package is built before it is renamed into place (same filesystem as ``out``)."""
    return out.with_name(out.name + ".partial")


def commit(staged: Path, out: Path, *, overwrite: bool) -> None:
    """Move a fully written package from ``staged`` to ``out`` in one rename.

    A reader sees either no package or a complete one. An existing ``out`` is refused unless
    ``overwrite``; then it is moved aside first and removed after the new one is in place.
    """
    old: Path | None = None
    if out.exists():
        if not overwrite:
            raise ConfigError(f"{out} already exists; pass --overwrite to replace it")
        old = out.with_name(out.name + f".old-{os.getpid()}")
        os.replace(out, old)
    os.replace(staged, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
