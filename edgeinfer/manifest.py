"""The package contract: ``manifest.json``.

A package is a folder that ``edgeinfer export`` writes and everything else only reads. The
manifest names every file with its sha256 and size, says what the graph takes and returns, and
records where the model came from and what accuracy the export kept. The runtime reads graph
and tokenizer names from here and never guesses them.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from edgeinfer.errors import IntegrityError, ManifestError, PackageError
from edgeinfer.package_io import PackageIO, io_from_dict, io_to_dict

__all__ = [
    "ENGINE_CACHE_DIR_KEY",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_DEPTH",
    "SCHEMA_VERSION",
    "SIGNATURE_NAME",
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
# The signature ``edgeinfer sign`` writes next to the manifest (bridge/ota/signing.py reads it).
SIGNATURE_NAME = "manifest.sig"
# A manifest is read before anything in it is trusted: its size is bounded before it is
# parsed, its nesting as it is. 1 MiB: the largest edgeinfer writes is ~32 KB (an image
# classifier's: 1000 labels and its smoke outputs): 30x room for bigger ones, and 1 MiB
# parses in ~5 ms on an x86 server core, where 50 MB takes over a second and ~4x its size
# in memory.
MAX_MANIFEST_BYTES = 1 << 20
# The deepest edgeinfer writes nests 7 levels (a raw package's smoke cases: smoke -> cases ->
# case -> outputs -> tensor -> shape); 32 leaves room for new fields, far below the depth at
# which Python's own recursion (``asdict``, ``json.dumps``) would fail.
MAX_MANIFEST_DEPTH = 32
# manifest ``extra`` key: the TensorRT engine cache folder, relative to the package.
ENGINE_CACHE_DIR_KEY = "engine_cache_dir"
DEFAULT_ENGINE_CACHE_DIR = "trt_engines"
Task = Literal["embed", "classify", "generate", "raw", "detect", "segment"]
TASKS: tuple[str, ...] = ("embed", "classify", "generate", "raw", "detect", "segment")
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
    """Every file name the manifest points at besides ``files``: graph, tokenizers, segments."""
    io = io if isinstance(io, dict) else {}
    keys = ("graph", "tokenizer", "light_tokenizer")
    names = [io[key] for key in keys if io.get(key) is not None]
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
        return package / str(self.extra.get(ENGINE_CACHE_DIR_KEY, DEFAULT_ENGINE_CACHE_DIR))

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
        listed = data.get("files")
        if not isinstance(listed, dict):
            raise ManifestError("manifest is malformed: it has no 'files' object; re-export it")
        for name in listed:
            check_member_name(name)
        for name in _named_files(data.get("io"), data.get("early_exit")):
            if check_member_name(name) not in listed:
                raise ManifestError(
                    f"the manifest names {name} but its files do not list it, so nothing "
                    "would check what it holds; re-export the package"
                )
        _check_engine_dir(data.get("extra"), listed)
        try:
            files = {
                str(name): FileEntry(sha256=str(e["sha256"]), bytes=int(e["bytes"]))
                for name, e in listed.items()
            }
            return cls(**{**data, "files": files, "io": io_from_dict(data.get("io"))})
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from exc

    @classmethod
    def parse(cls, raw: bytes, *, source: str = MANIFEST_NAME) -> Manifest:
        """Parse the bytes of a ``manifest.json`` (``source`` names them in errors): at most
        ``MAX_MANIFEST_BYTES``, refused before parsing when larger, and at most
        ``MAX_MANIFEST_DEPTH`` levels deep; every failure is a ``ManifestError``."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"{source} has more than {MAX_MANIFEST_BYTES} bytes, far more than any "
                "manifest edgeinfer writes: the package is not one of ours; re-export it"
            )
        try:
            data = json.loads(raw.decode("utf-8"))
        except RecursionError as exc:  # the C decoder's own guard against deep nesting
            raise ManifestError(
                f"{source} nests deeper than {MAX_MANIFEST_DEPTH} levels; re-export the package"
            ) from exc
        except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise ManifestError(f"{source} is not valid JSON: {exc}") from exc
        if _depth_over(data, MAX_MANIFEST_DEPTH):
            raise ManifestError(
                f"{source} nests deeper than {MAX_MANIFEST_DEPTH} levels; re-export the package"
            )
        if not isinstance(data, dict):
            raise ManifestError(f"{source} must hold a JSON object")
        return cls.from_dict(data)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """Read and parse ``folder/manifest.json`` (see ``parse``); a link is refused."""
        path = Path(folder) / MANIFEST_NAME
        if path.is_symlink():
            raise IntegrityError(_link_message(MANIFEST_NAME, folder))
        if not path.is_file():
            hint = "the folder does not exist" if not Path(folder).exists() else "no manifest.json"
            raise ManifestError(
                f"{folder} is not an edgeinfer package ({hint}); create one with `edgeinfer export`"
            )
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)  # one byte more tells "too big" apart
        except OSError as exc:
            raise ManifestError(f"cannot read {path}: {exc}") from exc
        return cls.parse(raw, source=str(path))

    def check_layout(self, folder: Path) -> None:
        """Refuse a package folder that holds anything but its listed files, without hashing
        them (``load(verify=False)`` runs this too): a symbolic link anywhere in it, a file
        the manifest does not list, a listed file that is missing or not a plain file.

        Allowed besides the listed files: ``manifest.json``, ``manifest.sig`` and the
        TensorRT engine cache (``engine_cache_dir``), which the runtime itself writes.
        Why refuse unlisted files instead of hiding them from onnxruntime: the runtime does
        not parse graphs (onnx is export-only), so it cannot tell which files a graph reads,
        and onnxruntime opens a graph's external data by the name the graph gives, from the
        graph's folder (1.32 refuses names and links that leave that folder). A folder that
        holds exactly the listed files leaves it nothing unhashed to open. Copying the listed
        files to a private folder instead would cost the package's size on every load and
        lose the memory mapping of aligned weights.
        """
        root = Path(folder).resolve()  # the folder itself may be a link ("current" -> v3)
        engines = self.extra.get(ENGINE_CACHE_DIR_KEY, DEFAULT_ENGINE_CACHE_DIR)
        seen: set[str] = set()
        pending = [root]
        while pending:
            directory = pending.pop()
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError as exc:
                raise PackageError(f"cannot list {directory}: {exc}") from exc
            for entry in entries:
                name = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    raise IntegrityError(_link_message(name, folder))
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    raise IntegrityError(
                        f"package entry {name} in {folder} is not a plain file (a device, "
                        "pipe or socket); the package is unsafe: remove it or re-export"
                    )
                elif name in self.files:
                    seen.add(name)
                elif name not in (MANIFEST_NAME, SIGNATURE_NAME) and not _under(name, engines):
                    raise IntegrityError(
                        f"{folder} holds {name}, which its manifest does not list: nothing "
                        "checks an unlisted file, yet a graph may read it (as its external "
                        "weights); the package is unsafe: remove the file or re-export"
                    )
        for name in sorted(set(self.files) - seen):
            raise IntegrityError(f"package file {name} is missing from {folder}; re-export it")

    def verify(self, folder: Path) -> None:
        """Check the folder's layout (``check_layout``), then every listed file's size and
        sha256; raise ``IntegrityError`` on the first difference, before any file is parsed."""
        self.check_layout(folder)
        for name, entry in sorted(self.files.items()):
            path = Path(folder) / name
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


def _link_message(name: str, folder: Path) -> str:
    return (
        f"package entry {name} in {folder} is a symbolic link: a package holds plain files "
        "only (a link may lead outside it); the package is unsafe: copy it without links "
        "(cp -rL) or re-export it"
    )


def _under(name: str, folder: object) -> bool:
    """Whether package file ``name`` lies in the package folder ``folder``."""
    return isinstance(folder, str) and name.startswith(folder.rstrip("/") + "/")


def _check_engine_dir(extra: object, listed: dict[str, Any]) -> None:
    """The engine cache folder is a plain relative folder that holds no listed file: its
    unlisted files are allowed (TensorRT writes them), so it must not cover package files."""
    folder = extra.get(ENGINE_CACHE_DIR_KEY) if isinstance(extra, dict) else None
    if folder is not None:
        check_member_name(folder)
    folder = DEFAULT_ENGINE_CACHE_DIR if folder is None else folder
    inside = [name for name in listed if name == folder or _under(name, folder)]
    if inside:
        raise ManifestError(
            f"the manifest's engine cache folder {folder!r} holds package files {inside}; "
            "engines and package files must live apart: re-export the package"
        )


def _depth_over(data: object, limit: int) -> bool:
    """Whether JSON ``data`` nests more than ``limit`` lists/objects deep (no recursion)."""
    pending: list[tuple[object, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            pending.extend((child, depth + 1) for child in children)
    return False


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
