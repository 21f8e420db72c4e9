"""Where a model comes from: a builtin recipe (``models/``), a local Hugging Face model folder,
a GGUF file, or an ONNX file (alone, or in a folder with its tokenizer, config and labels).
Never a hub."""

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
        onnx_file: the ONNX graph inside ``path`` when the source is one, else None.
    """

    name: str
    path: Path
    config: dict[str, Any]
    max_seq_len: int
    gguf_file: str | None = None
    recipe: Recipe | None = None
    onnx_file: str | None = None

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
            graph = self.onnx_file is not None and name.startswith(self.onnx_file)
            if graph or name in _WEIGHT_FILES or name.endswith((".safetensors", ".gguf")):
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


# Families whose position ids start after the padding index (fairseq's convention), so that
# their position table holds pad_token_id + 1 more rows than the longest input.
_POSITION_OFFSET_TYPES = ("roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text")
# A tokenizer_config model_max_length at least this large means "no limit" (transformers
# writes int(1e30) when a tokenizer has none).
_NO_LIMIT = 1 << 40


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _max_seq_len(folder: Path, config: dict[str, Any]) -> int:
    """The window the model is used with, in tokens: sentence-transformers' max_seq_length
    when present (MiniLM was trained at 256 tokens though its position table has 512); else
    the position table's size, less the RoBERTa family's offset (514 rows hold 512 tokens),
    capped by the tokenizer's ``model_max_length``."""
    value = _json_file(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(value, int) and value > 0:
        return value
    window = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in _POSITION_OFFSET_TYPES:
        pad = config.get("pad_token_id")
        window -= (1 if pad is None else int(pad)) + 1
    limit = _json_file(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(limit, (int, float)) and 0 < limit < _NO_LIMIT:
        window = min(window, int(limit))
    return window


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
    if folder.is_file() and folder.suffix == ".onnx":
        return _onnx_source(folder.stem, folder.parent, folder.name)
    if not folder.is_dir():
        raise ConfigError(
            f"source {folder} is a file but not an .onnx graph; pass an ONNX file or a model folder"
        )
    return _folder_source(folder.resolve().name, folder)


def _recipe_source(recipe: Recipe, work: Path | None) -> Source:
    folder = recipe.locate(work)
    if recipe.onnx.get("file"):
        found = _onnx_source(recipe.name, folder, str(recipe.onnx["file"]))
        return Source(
            name=found.name,
            path=found.path,
            config=found.config,
            max_seq_len=found.max_seq_len,
            recipe=recipe,
            onnx_file=found.onnx_file,
        )
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


def _onnx_source(name: str, folder: Path, graph: str) -> Source:
    """An ONNX graph, with what its folder holds beside it (config.json, tokenizer.json)."""
    if not (folder / graph).is_file():
        raise ConfigError(f"{folder / graph} does not exist")
    config = _json_file(folder / "config.json")
    return Source(
        name=name,
        path=folder.resolve(),
        config=config,
        max_seq_len=_max_seq_len(folder, config) if (folder / "tokenizer.json").is_file() else 0,
        onnx_file=graph,
    )


def _has_weights(folder: Path) -> bool:
    return any((folder / w).is_file() for w in _WEIGHT_FILES) or any(folder.glob("*.safetensors"))


def _folder_source(name: str, folder: Path) -> Source:
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    graphs = sorted(p.name for p in folder.glob("*.onnx"))
    config_path = folder / "config.json"
    if ggufs and not config_path.is_file():
        return _gguf_source(name, folder, ggufs[0])
    if graphs and not _has_weights(folder):
        if len(graphs) > 1 and "model.onnx" not in graphs:
            raise ConfigError(
                f"{folder} holds several ONNX graphs ({', '.join(graphs)}); pass the one to "
                "export as the source"
            )
        return _onnx_source(name, folder, "model.onnx" if "model.onnx" in graphs else graphs[0])
    if not config_path.is_file():
        raise ConfigError(
            f"{folder} has no config.json and no .onnx graph; pass a Hugging Face model folder "
            "or an ONNX file"
        )
    config = _json_file(config_path)
    if not _has_weights(folder):
        raise ConfigError(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")
    images = "ForImageClassification" in " ".join(config.get("architectures") or [])
    if images and not (folder / "preprocessor_config.json").is_file():
        raise ConfigError(
            f"{folder} is an image classifier without preprocessor_config.json (the image "
            "processor's settings: size, mean, std); save it with the model"
        )
    if not images and not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"{folder} has no tokenizer.json (a fast tokenizer file is required)")
    return Source(
        name=name,
        path=folder.resolve(),
        config=config,
        max_seq_len=0 if images else _max_seq_len(folder, config),
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
