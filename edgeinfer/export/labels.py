"""A classifier package's class names, in output order: from a file (one per line), or the
model config's ``id2label`` (text encoders, image classifiers and ONNX files alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError

__all__ = ["default_labels", "read_labels"]


def read_labels(path: Path, *, count: int | None) -> tuple[str, ...]:
    """Class names, one per line, in output order; ``count`` (the graph's classes) must match."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read labels {path}: {exc}") from exc
    labels = tuple(line.strip() for line in lines if line.strip())
    if not labels:
        raise ConfigError(f"{path} holds no labels (one class name per line)")
    if count is not None and len(labels) != count:
        raise ConfigError(f"{path} holds {len(labels)} labels, but the model has {count} classes")
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{path} names a class twice; every label must be unique")
    return labels


def default_labels(config: dict[str, Any], count: int) -> tuple[str, ...]:
    """The config's ``id2label`` when it names every class, else ``LABEL_0`` ... (what
    transformers calls classes without names)."""
    id2label = config.get("id2label") or {}
    names = [id2label.get(str(i), id2label.get(i)) for i in range(count)]
    if all(isinstance(n, str) for n in names) and len(set(names)) == count:
        return tuple(str(n) for n in names)
    return tuple(f"LABEL_{i}" for i in range(count))
