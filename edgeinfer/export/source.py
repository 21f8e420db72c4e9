"""Where a model comes from: a builtin recipe (``models/``), or a local Hugging Face model
folder or GGUF file. Never a hub."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, MissingDependencyError
from edgeinfer.export import recipes
from edgeinfer.export.recipes import Recipe
from edgeinfer.manifest import sha256_file

__all__ = ["Source", "resolve_source"]

# No code path of edgeinfer may reach a model hub: every source is a local folder.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class Source:
    """A resolved source model.

    Attributes:
        name: the builtin name, or the folder's name.
        path: the local model folder (config.json, weights, tokenizer; a recipe's files).
        config: the parsed ``config.json`` ({} when the source has none).
        max_seq_len: the longest input the source model is used with, in tokens (0: no text).
        gguf_file: the GGUF weights file inside ``path`` when the source is one (transformers
            dequantizes it to fp32), else None.
        recipe: the builtin's recipe, or None for a user's folder.
    """

    name: str
    path: Path
    config: dict[str, Any]
    max_seq_len: int
    gguf_file: str | None = None
    recipe: Recipe | None = None

    @property
    def builtin(self) -> bool:
        """Whether ``name`` is a builtin (so a package can find its source again)."""
        return self.recipe is not None

    @property
    def model_type(self) -> str:
        """The transformers ``model_type`` (``bert``, ``llama``, ...), or the recipe's builder."""
        fallback = self.recipe.builder if self.recipe else "unknown"
        return str(self.config.get("model_type", fallback))

    def weights_sha256(self) -> str:
        """sha256 over the weights files' digests, so a package names what it was built from
        (a recipe's pinned digests, already checked; else the folder's weight files)."""
        digest = hashlib.sha256()
        if self.recipe is not None and self.recipe.sha256:
            for name, sha in sorted(self.recipe.sha256.items()):
                digest.update(f"{name}:{sha}\n".encode())
            return digest.hexdigest()
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


def resolve_source(spec: str, *, work: Path | None = None) -> Source:
    """Resolve ``spec`` (a builtin name or a local model folder) to a ``Source``.

    ``work`` is where a builtin built by a script is built (required for those).

    Raises:
        ConfigError: the path does not exist or holds no model; a hub id is given.
        MissingDependencyError: the package that ships a builtin is not installed.
        IntegrityError: a builtin's file differs from the sha256 its recipe pins.
    """
    recipe = recipes.find(spec)
    if recipe is not None:
        return _recipe_source(recipe, work)
    folder = Path(spec).expanduser()
    if not folder.exists():
        names = ", ".join(r.name for r in recipes.all_recipes())
        looks_like_hub_id = "/" in spec and not spec.startswith((".", "/", "~"))
        hint = (
            " It looks like a model hub id: edgeinfer never downloads; download the model "
            "folder on a connected machine and pass its path."
            if looks_like_hub_id
            else " Pass a builtin name or the path of a model folder."
        )
        raise ConfigError(
            f"source {spec!r} does not exist: it is neither a builtin ({names}) nor a path.{hint}"
        )
    if not folder.is_dir():
        raise ConfigError(f"source {folder} is a file; pass the model folder that holds it")
    return _folder_source(folder.resolve().name, folder)


def _recipe_source(recipe: Recipe, work: Path | None) -> Source:
    folder = recipe.locate(work)
    if (folder / "config.json").is_file() or any(folder.glob("*.gguf")):
        found = _folder_source(recipe.name, folder)
        return Source(
            name=found.name,
            path=found.path,
            config=found.config,
            max_seq_len=found.max_seq_len,
            gguf_file=found.gguf_file,
            recipe=recipe,
        )
    return Source(name=recipe.name, path=folder, config={}, max_seq_len=0, recipe=recipe)


def _folder_source(name: str, folder: Path) -> Source:
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    config_path = folder / "config.json"
    if ggufs and not config_path.is_file():
        return _gguf_source(name, folder, ggufs[0])
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
        name=name,
        path=folder.resolve(),
        config=config,
        max_seq_len=_max_seq_len(folder, config),
    )


def _gguf_source(name: str, folder: Path, gguf_file: str) -> Source:
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
        config=config,
        max_seq_len=int(config.get("max_position_embeddings", 2048)),
        gguf_file=gguf_file,
    )
