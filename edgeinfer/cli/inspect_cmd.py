"""``edgeinfer inspect PKG``: the manifest, a checksum verification and this device's providers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from edgeinfer.cli.common import console, print_json

__all__ = ["inspect"]


def inspect(
    package: Annotated[Path, typer.Argument(help="package folder")],
    json_output: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """Show a package's manifest, verify every file's sha256, list this device's providers."""
    from edgeinfer import providers
    from edgeinfer.manifest import Manifest

    manifest = Manifest.read(package)
    manifest.verify(package)  # raises IntegrityError (exit 2) on the first mismatch
    info: dict[str, Any] = {
        "package": str(package),
        "digest": manifest.digest,
        "verified": True,
        "available_providers": providers.available(),
        "manifest": manifest.to_dict(),
    }
    if json_output:
        print_json(info)
        return
    table = Table(title=f"{package} ({manifest.name}, {manifest.task})", show_header=False)
    acc = manifest.accuracy.get("value", {})
    rows = [
        ("precision", f"{manifest.precision} ({manifest.quantization.get('mode')})"),
        ("target", manifest.target),
        (
            "accuracy",
            f"{acc.get('metric')} mean {acc.get('mean')} min {acc.get('min')} "
            f"vs {manifest.accuracy.get('reference')}",
        ),
        ("inputs", ", ".join(i["name"] for i in manifest.io["inputs"])),
        ("max_seq_len", str(manifest.io["max_seq_len"])),
        ("files", ", ".join(f"{n} ({e.bytes / 1e6:.1f} MB)" for n, e in manifest.files.items())),
        ("checksums", "verified"),
        ("preferred providers", ", ".join(manifest.providers)),
        ("available here", ", ".join(info["available_providers"])),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
