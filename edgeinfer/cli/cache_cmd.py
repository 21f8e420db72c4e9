"""``edgeinfer cache stats|clear PKG``: the on-disk result cache of one package."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from edgeinfer.cli.common import JsonOut, aliased, console, deprecated, print_json

__all__ = ["app", "clear", "stats"]

app = typer.Typer(help="Inspect or empty a package's on-disk result cache.", no_args_is_help=True)

PackageArg = Annotated[Path, typer.Argument(help="package folder")]
# serve --cache-dir's spelling: the same folder.
DirOption = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir", help="cache folder (default: $EDGEINFER_CACHE_DIR or ~/.cache/edgeinfer)"
    ),
]
OldDirOption = Annotated[Path | None, deprecated("--dir", instead="--cache-dir")]


def _folder(directory: Path | None, old: Path | None) -> Path | None:
    return aliased(directory, old, default=None, names="--cache-dir / --dir")


def _db_path(package: Path, directory: Path | None) -> Path:
    from edgeinfer.config import CacheConfig
    from edgeinfer.manifest import Manifest

    digest = Manifest.read(package).digest
    return CacheConfig(directory=directory).db_path(digest)


def _stats(path: Path) -> dict[str, Any]:
    from edgeinfer.runtime.cache.stores import SqliteStore

    if not path.exists():  # do not create a file just to say it is empty
        return {"path": str(path), "exists": False, "entries": 0, "bytes": 0}
    store = SqliteStore(path, capacity_bytes=2**62, ttl_s=None)
    try:
        s = store.stats()
    finally:
        store.close()
    now = time.time()
    return {
        "path": str(path),
        "exists": True,
        "entries": s.entries,
        "bytes": s.bytes,
        "file_bytes": s.file_bytes,
        "oldest_age_s": None if s.oldest_s is None else round(now - s.oldest_s, 1),
        "newest_age_s": None if s.newest_s is None else round(now - s.newest_s, 1),
    }


@app.command("stats")
def stats(
    package: PackageArg,
    directory: DirOption = None,
    json_output: JsonOut = False,
    old_directory: OldDirOption = None,
) -> None:
    """Show how many results the package's cache holds and how much space they take."""
    info = _stats(_db_path(package, _folder(directory, old_directory)))
    if json_output:
        print_json(info)
        return
    if not info["exists"]:
        console.print(f"no result cache yet for {package} (would be {info['path']})")
        return
    console.print(
        f"{info['path']}: {info['entries']} entries, {info['bytes'] / 1e6:.2f} MB of results, "
        f"{info['file_bytes'] / 1e6:.2f} MB on disk, oldest {info['oldest_age_s']} s ago"
    )


@app.command("clear")
def clear(
    package: PackageArg,
    directory: DirOption = None,
    json_output: JsonOut = False,
    old_directory: OldDirOption = None,
) -> None:
    """Delete every cached result of the package (the file stays, empty)."""
    from edgeinfer.runtime.cache.stores import SqliteStore

    path = _db_path(package, _folder(directory, old_directory))
    removed = 0
    if path.exists():
        store = SqliteStore(path, capacity_bytes=2**62, ttl_s=None)
        try:
            removed = store.stats().entries
            store.clear()
        finally:
            store.close()
    if json_output:
        print_json({"path": str(path), "removed": removed})
        return
    console.print(f"cleared {removed} entries from {path}")
