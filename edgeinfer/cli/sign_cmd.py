"""``edgeinfer keygen`` and ``edgeinfer sign PKG``: Ed25519 keys and signed releases.

``keygen -o keys/release`` writes ``keys/release.key`` (private, mode 0600) and
``keys/release.pub`` (give it to bridges with ``serve --trusted-key``); ``--rotate-from
OLD.key`` also writes ``STEM.cert``: the new key endorsed by the old one, so bridges that
trust the old key take the new one. ``sign PKG --key keys/release.key --device-id plc7`` writes
``PKG/manifest.sig``: a signature over ``manifest.json`` (which lists every file's sha256) and
the release metadata: version, devices or class, served name, target, size, expiry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgeinfer.cli.common import JsonOut, aliased, console, deprecated, print_json

__all__ = ["keygen", "sign"]


def keygen(
    out: Annotated[
        Path, typer.Option("-o", "--out", help="path stem: writes STEM.key and STEM.pub")
    ],
    rotate_from: Annotated[
        Path | None,
        typer.Option(help="an older private key that endorses the new one (writes STEM.cert)"),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="replace existing key files")] = False,
    json_out: JsonOut = False,
) -> None:
    """Make an Ed25519 key pair for signing packages."""
    from edgeinfer.bridge.ota.signing import generate_keypair

    key, pub, key_id = generate_keypair(out, overwrite=overwrite, rotate_from=rotate_from)
    if json_out:
        print_json({"private_key": str(key), "public_key": str(pub), "key_id": key_id})
    else:
        endorsed = (
            f"; endorsed by {rotate_from} in {out.with_suffix('.cert')}" if rotate_from else ""
        )
        console.print(f"wrote {key} (private: keep it secret) and {pub}; key id {key_id}{endorsed}")


def sign(
    package: Annotated[Path, typer.Argument(help="the package folder to sign")],
    key: Annotated[Path, typer.Option(help="the private key (edgeinfer keygen's .key file)")],
    device_id: Annotated[
        list[str] | None,
        typer.Option("--device-id", help="a device id that may take it (repeatable)"),
    ] = None,
    compatible: Annotated[
        str | None, typer.Option(help="or: a device class (bridges' serve --compatible)")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="the name it may be served as (default: the manifest's)")
    ] = None,
    version: Annotated[
        int | None,
        typer.Option(help="above every earlier release of the name (default: now, epoch ms)"),
    ] = None,
    expires_in_days: Annotated[
        float,
        typer.Option(
            help="devices refuse the release after this long (30: a staged rollout reaches "
            "devices that connect weekly; a captured release is stale within a month)"
        ),
    ] = 30.0,
    trial: Annotated[
        bool,
        typer.Option(
            help="devices serve it in a trial window against the package it replaces and "
            "commit it only if it holds up on their own traffic (else they roll back)"
        ),
    ] = False,
    trial_set: Annotated[
        list[str] | None,
        typer.Option(
            help="a trial threshold, NAME=NUMBER (repeatable; implies --trial): window_s, "
            "max_window_s, min_requests, min_shadow, shadow_share, max_error_rate, "
            "max_p99_ratio, min_agreement, min_cosine"
        ),
    ] = None,
    json_out: JsonOut = False,
    device: Annotated[list[str] | None, deprecated("--device", instead="--device-id")] = None,
) -> None:
    """Sign a package as a release for some devices (writes PKG/manifest.sig)."""
    from edgeinfer.bridge.ota.release import sign_package
    from edgeinfer.manifest import Manifest

    devices: list[str] | None = aliased(
        device_id, device, default=None, names="--device-id / --device"
    )
    Manifest.read(package).verify(package)  # sign only what verifies
    record = sign_package(
        package,
        key,
        devices=devices or [],
        compatible=compatible,
        name=name,
        version=version,
        expires_in_days=expires_in_days,
        trial=_trial(trial_set) if trial or trial_set else None,
    )
    if json_out:
        print_json(record)
    else:
        release = record["release"]
        console.print(
            f"signed {package} with key {record['key_id']}: {release['name']} version "
            f"{release['version']} for {release['devices'] or release['compatible']}"
        )


def _trial(settings: list[str] | None) -> dict[str, float | int]:
    """``--trial-set NAME=NUMBER`` options as the release's trial thresholds."""
    from edgeinfer.errors import ConfigError

    thresholds: dict[str, float | int] = {}
    for item in settings or []:
        key, _, value = item.partition("=")
        try:
            number = float(value)
        except ValueError as exc:
            raise ConfigError(f"--trial-set {item!r}: expected NAME=NUMBER") from exc
        whole = key.strip() in ("min_requests", "min_shadow") and number.is_integer()
        thresholds[key.strip()] = int(number) if whole else number
    return thresholds
