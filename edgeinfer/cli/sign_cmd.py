"""``edgeinfer keygen`` and ``edgeinfer sign PKG``: Ed25519 keys and package signatures.

``keygen -o keys/release`` writes ``keys/release.key`` (private, mode 0600) and
``keys/release.pub`` (give it to bridges with ``serve --trusted-key``). ``sign PKG --key
keys/release.key`` writes ``PKG/manifest.sig``: a signature over ``manifest.json``, which lists
every file's sha256, so the one signature covers the whole package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import console, print_json

__all__ = ["keygen", "sign"]


def keygen(
    out: Annotated[
        Path, typer.Option("-o", "--out", help="path stem: writes STEM.key and STEM.pub")
    ],
    overwrite: Annotated[bool, typer.Option(help="replace existing key files")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Make an Ed25519 key pair for signing packages."""
    from edgeinfer.bridge.signing import generate_keypair

    key, pub, key_id = generate_keypair(out, overwrite=overwrite)
    if json_out:
        print_json({"private_key": str(key), "public_key": str(pub), "key_id": key_id})
    else:
        console.print(f"wrote {key} (private: keep it secret) and {pub}; key id {key_id}")


def sign(
    package: Annotated[Path, typer.Argument(help="the package folder to sign")],
    key: Annotated[Path, typer.Option(help="the private key (edgeinfer keygen's .key file)")],
    json_out: Annotated[bool, typer.Option("--json", help="print the signature as JSON")] = False,
) -> None:
    """Sign a package's manifest (writes PKG/manifest.sig)."""
    from edgeinfer.bridge.signing import sign_package
    from edgeinfer.manifest import Manifest

    Manifest.read(package).verify(package)  # sign only what verifies
    record = sign_package(package, key)
    if json_out:
        print_json(record)
    else:
        console.print(f"signed {package} with key {record['key_id']}")
