"""Writing packages: stage the files, hash them into the manifest, then rename atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import Manifest, file_entries
from edgeinfer.package_io import TensorSpec

__all__ = ["GRAPH_NAME", "TOKENIZER_NAME", "commit", "partial_path", "read_io", "stage"]

GRAPH_NAME = "model.onnx"
TOKENIZER_NAME = "tokenizer.json"
_DTYPE_NAMES = {7: "int64", 6: "int32", 1: "float32", 10: "float16"}


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
