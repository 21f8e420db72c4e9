"""Writing packages: stage the files, hash them into the manifest, then rename atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest, file_entries

__all__ = [
    "GRAPH_NAME",
    "TOKENIZER_NAME",
    "commit",
    "external_data_files",
    "partial_path",
    "read_io",
    "save_graph",
    "stage",
]

GRAPH_NAME = "model.onnx"
TOKENIZER_NAME = "tokenizer.json"
_DTYPE_NAMES = {7: "int64", 6: "int32", 1: "float32", 10: "float16"}
# protobuf refuses a message over 2 GiB: larger graphs (a 0.5B+ decoder in fp32, its tied
# lm_head a second copy of the table) keep their weights in one file beside the graph.
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
    """The files (relative to the graph's folder) that hold ``graph``'s external weights."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sorted(
        {
            entry.value
            for init in model.graph.initializer
            for entry in init.external_data
            if entry.key == "location"
        }
    )


def read_io(graph: Path) -> dict[str, list[dict[str, Any]]]:
    """The graph's inputs and outputs as ``{name, dtype, shape}`` (symbolic dims as names)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)

    def describe(values: Any) -> list[dict[str, Any]]:
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param or d.dim_value for d in t.shape.dim]
            out.append(
                {
                    "name": v.name,
                    "dtype": _DTYPE_NAMES.get(t.elem_type, str(t.elem_type)),
                    "shape": shape,
                }
            )
        return out

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


def _place(src: Path, dst: Path) -> None:
    """Hard-link when possible (a staged candidate costs no copy), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def stage(
    folder: Path,
    *,
    graph: Path,
    tokenizer: Path,
    fields: dict[str, Any],
    extra_files: dict[str, bytes] | None = None,
) -> Manifest:
    """Lay out a package in ``folder``: graph, tokenizer, extra files and the manifest.

    ``fields`` are the manifest fields other than ``files`` and ``io``'s graph/tokenizer names.
    """
    folder.mkdir(parents=True, exist_ok=False)
    _place(graph, folder / GRAPH_NAME)
    weights = external_data_files(graph)  # found by onnxruntime under the names they have
    for name in weights:
        _place(graph.parent / name, folder / name)
    _place(tokenizer, folder / TOKENIZER_NAME)
    for name, data in (extra_files or {}).items():
        (folder / name).write_bytes(data)
    io = {
        **fields["io"],
        **read_io(folder / GRAPH_NAME),
        "graph": GRAPH_NAME,
        "tokenizer": TOKENIZER_NAME,
    }
    names = [GRAPH_NAME, *weights, TOKENIZER_NAME, *(extra_files or {})]
    manifest = Manifest(**{**fields, "io": io, "files": file_entries(folder, names)})
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
