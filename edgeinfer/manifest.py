"""The package contract: ``manifest.json``.

A package is a folder that ``edgeinfer export`` writes and everything else only reads. The
manifest names every file with its sha256 and size, says what the graph takes and returns, and
records where the model came from and what accuracy the export kept. The runtime reads graph
and tokenizer names from here and never guesses them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from edgeinfer.errors import IntegrityError, ManifestError, PackageError
from edgeinfer.package_io import PackageIO, io_from_dict, io_to_dict

__all__ = [
    "ENGINE_CACHE_DIR_KEY",
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "FileEntry",
    "Manifest",
    "Task",
    "check_member_name",
    "file_entries",
    "sha256_file",
]

# 2: ``io`` is typed by ``io.kind``; 1 is still read (``_upgrade_v1``).
SCHEMA_VERSION = 2
MANIFEST_NAME = "manifest.json"
# manifest ``extra`` key: the TensorRT engine cache folder, relative to the package.
ENGINE_CACHE_DIR_KEY = "engine_cache_dir"
Task = Literal["embed", "classify", "generate", "raw"]
TASKS: tuple[str, ...] = ("embed", "classify", "generate", "raw")
_CHUNK_BYTES = 1 << 20
IO = TypeVar("IO")


def check_member_name(name: object) -> str:
    """``name`` when it is a plain relative path inside a package; else ``IntegrityError``.

    A package is untrusted input (it may arrive over the network): a manifest must not name a
    file outside its folder (absolute, ``..``, a drive letter or backslash, empty parts).
    """
    text = name if isinstance(name, str) else ""
    parts = text.split("/")
    if (
        not text
        or text.startswith("/")
        or "\\" in text
        or ":" in text
        or "\0" in text
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise IntegrityError(
            f"package file name {name!r} is not a plain relative path inside the package "
            "(no absolute path, '..', backslash or drive letter); the package is unsafe: "
            "re-export it"
        )
    return text


def _named_files(io: Any, early_exit: Any) -> list[object]:
    """Every file name the manifest points at besides ``files``: graph, tokenizer, segments."""
    io = io if isinstance(io, dict) else {}
    names = [io[key] for key in ("graph", "tokenizer") if io.get(key) is not None]
    names += io.get("graphs") if isinstance(io.get("graphs"), list) else []
    segments = early_exit.get("segments") if isinstance(early_exit, dict) else None
    for segment in segments if isinstance(segments, list) else []:
        if isinstance(segment, dict) and "graph" in segment:
            names.append(segment["graph"])
    return names


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One package file: its sha256 and its size in bytes."""

    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json`` of a model package (schema v2).

    ``io`` is the package kind's typed IO (``package_io``): which files to load and what the
    graphs take and return. ``early_exit`` holds the exit rule of ``exit-segments`` packages;
    ``smoke`` a few inputs with their expected outputs, checked after a deploy.
    """

    name: str
    task: Task
    source: dict[str, Any]
    created_by: dict[str, str]
    target: str
    precision: str
    quantization: dict[str, Any]
    providers: list[str]
    io: PackageIO
    tokens: dict[str, int | None]
    accuracy: dict[str, Any]
    files: dict[str, FileEntry]
    early_exit: dict[str, Any] | None = None
    smoke: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest as plain JSON-ready data."""
        return {**asdict(self), "io": io_to_dict(self.io)}

    def io_as(self, kind: type[IO]) -> IO:
        """``io`` as the kind ``kind`` (a ``package_io`` class); ``PackageError`` otherwise."""
        if not isinstance(self.io, kind):
            raise PackageError(
                f"{self.name} is a {self.io.kind!r} package, not {getattr(kind, 'kind', kind)!r}"
            )
        return self.io

    def write(self, folder: Path) -> Path:
        """Write ``manifest.json`` into ``folder`` and return its path."""
        path = folder / MANIFEST_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    def engine_cache_dir(self, package: Path) -> Path:
        """Where TensorRT keeps this package's built engines: ``extra["engine_cache_dir"]``
        (relative to ``package``), default ``trt_engines/`` inside the package. Engines are
        specific to one graph, GPU and TensorRT version, so they live with the package."""
        return package / str(self.extra.get(ENGINE_CACHE_DIR_KEY, "trt_engines"))

    @property
    def digest(self) -> str:
        """A sha256 over every file's digest: the package's identity (for caches, replies)."""
        joined = "\n".join(f"{name}:{entry.sha256}" for name, entry in sorted(self.files.items()))
        return hashlib.sha256(joined.encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Build a manifest from parsed JSON, refusing other schemas and missing fields."""
        version = data.get("schema_version")
        if version == 1:
            data = _upgrade_v1(data)
            version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            raise ManifestError(
                f"manifest schema_version {version!r} is not supported by this edgeinfer "
                f"(it reads {SCHEMA_VERSION}); re-export the package with this version"
            )
        if data.get("task") not in TASKS:
            raise ManifestError(f"manifest task {data.get('task')!r} is not one of {TASKS}")
        listed = data["files"] if isinstance(data.get("files"), dict) else {}
        for name in [*listed, *_named_files(data.get("io"), data.get("early_exit"))]:
            check_member_name(name)
        try:
            files = {
                str(name): FileEntry(sha256=str(e["sha256"]), bytes=int(e["bytes"]))
                for name, e in data["files"].items()
            }
            return cls(**{**data, "files": files, "io": io_from_dict(data.get("io"))})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from exc

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """Read and parse ``folder/manifest.json``."""
        path = Path(folder) / MANIFEST_NAME
        if not path.is_file():
            hint = "the folder does not exist" if not Path(folder).exists() else "no manifest.json"
            raise ManifestError(
                f"{folder} is not an edgeinfer package ({hint}); create one with `edgeinfer export`"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ManifestError(f"{path} must hold a JSON object")
        return cls.from_dict(data)

    def verify(self, folder: Path) -> None:
        """Check every listed file's size and sha256; raise ``IntegrityError`` on the first
        difference, before any of them is parsed. A listed file that resolves outside the
        folder (through a symlink) is refused too."""
        root = Path(folder).resolve()
        for name, entry in sorted(self.files.items()):
            path = Path(folder) / name
            if not path.resolve().is_relative_to(root):
                raise IntegrityError(
                    f"package file {name} resolves outside {folder} (a symlink): the package "
                    "is unsafe; re-export or re-copy it without links"
                )
            if not path.is_file():
                raise IntegrityError(f"package file {name} is missing from {folder}; re-export it")
            size = path.stat().st_size
            if size != entry.bytes:
                raise IntegrityError(
                    f"package file {name} has {size} bytes, the manifest says {entry.bytes}: "
                    "the package is damaged or was modified; re-export or re-copy it"
                )
            if sha256_file(path) != entry.sha256:
                raise IntegrityError(
                    f"package file {name} does not match its sha256 in the manifest: "
                    "the package is damaged or was modified; re-export or re-copy it"
                )


def file_entries(folder: Path, names: list[str]) -> dict[str, FileEntry]:
    """Hash the named files of ``folder`` for a manifest's ``files`` field."""
    return {
        name: FileEntry(sha256=sha256_file(folder / name), bytes=(folder / name).stat().st_size)
        for name in sorted(names)
    }


def _upgrade_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema 1 manifest in schema 2 form: its ``io.kind`` follows from the task and the
    fields version 1 wrote for each kind (the only place a kind is inferred)."""
    io = dict(data.get("io") or {})
    early_exit = data.get("early_exit")
    if data.get("task") == "generate":
        kind = "decoder"
    elif early_exit:
        kind = "exit-segments"
        io["input"] = early_exit.get("input", "text")
        io["graphs"] = [s["graph"] for s in early_exit.get("segments", [])]
        io.pop("graph", None)
    elif "image" in io:
        kind = "image-classifier"
    else:
        kind = "text-encoder" if data.get("task") == "embed" else "text-classifier"
    return {**data, "schema_version": SCHEMA_VERSION, "io": {"kind": kind, **io}}
