"""Package signatures: Ed25519 over the exact bytes of ``manifest.json``.

The manifest lists every file's sha256, so one signature over it covers the whole package.
``edgeinfer keygen`` writes a key pair (``NAME.key``, private, mode 0600; ``NAME.pub``); ``edgeinfer
sign PKG --key NAME.key`` writes ``PKG/manifest.sig``::

    {"alg": "ed25519", "key_id": "<16 hex>", "manifest_sha256": "<hex>", "signature": "<base64>"}

A bridge is configured with the public keys it trusts and accepts a deploy only when its
signature verifies under one of them; ``key_id`` (the first 16 hex digits of the sha256 of
the raw public key) names the signer in statuses. Needs the ``cryptography`` package (the
``mqtt`` extra).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from edgeinfer.errors import ConfigError, IntegrityError, MissingDependencyError
from edgeinfer.manifest import MANIFEST_NAME

__all__ = [
    "SIGNATURE_NAME",
    "TrustedKeys",
    "generate_keypair",
    "key_id",
    "read_signature",
    "sign_package",
    "signature_for",
]

SIGNATURE_NAME: Final = "manifest.sig"
_ALG: Final = "ed25519"


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise MissingDependencyError("cryptography", "mqtt") from exc
    return ed25519


def _serialization() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization


def key_id(public_key: Any) -> str:
    """The signer's id: the first 16 hex digits of the sha256 of the raw public key."""
    ser = _serialization()
    raw = public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(stem: Path, *, overwrite: bool = False) -> tuple[Path, Path, str]:
    """Write ``STEM.key`` (private, PEM, mode 0600) and ``STEM.pub``; return them and the id."""
    ser = _serialization()
    private = _ed25519().Ed25519PrivateKey.generate()
    key_path, pub_path = stem.with_suffix(".key"), stem.with_suffix(".pub")
    for path in (key_path, pub_path):
        if path.exists() and not overwrite:
            raise ConfigError(f"{path} exists; pass --overwrite to replace it")
    stem.parent.mkdir(parents=True, exist_ok=True)
    pem = private.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = private.public_key()
    pub_path.write_bytes(
        public.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    )
    return key_path, pub_path, key_id(public)


def _load_private(path: Path) -> Any:
    ser = _serialization()
    try:
        key = ser.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not a readable unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, _ed25519().Ed25519PrivateKey):
        raise ConfigError(f"{path} is not an Ed25519 key; make one with `edgeinfer keygen`")
    return key


def signature_for(manifest_bytes: bytes, private_key: Path) -> dict[str, str]:
    """The signature record of ``manifest_bytes`` under the key in ``private_key``."""
    key = _load_private(private_key)
    return {
        "alg": _ALG,
        "key_id": key_id(key.public_key()),
        "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "signature": base64.b64encode(key.sign(manifest_bytes)).decode("ascii"),
    }


def sign_package(package: Path, private_key: Path) -> dict[str, str]:
    """Sign ``package/manifest.json`` and write ``package/manifest.sig``; return the record."""
    manifest = Path(package) / MANIFEST_NAME
    if not manifest.is_file():
        raise ConfigError(f"{package} has no {MANIFEST_NAME}: not an edgeinfer package")
    record = signature_for(manifest.read_bytes(), private_key)
    (Path(package) / SIGNATURE_NAME).write_text(json.dumps(record, indent=2) + "\n")
    return record


def read_signature(package: Path) -> dict[str, Any] | None:
    """``package/manifest.sig`` as a dict, or ``None`` when the package is not signed."""
    path = Path(package) / SIGNATURE_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path} is not a readable signature: {exc}") from exc
    if not isinstance(data, dict):
        raise IntegrityError(f"{path} is not a signature record")
    return data


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a bridge accepts deploys from, by key id."""

    keys: Mapping[str, Any]

    @classmethod
    def load(cls, paths: Iterable[Path]) -> TrustedKeys:
        """Read PEM public keys (``edgeinfer keygen``'s ``.pub`` files)."""
        ser, ed = _serialization(), _ed25519()
        keys: dict[str, Any] = {}
        for path in paths:
            try:
                key = ser.load_pem_public_key(Path(path).read_bytes())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{path} is not a readable PEM public key: {exc}") from exc
            if not isinstance(key, ed.Ed25519PublicKey):
                raise ConfigError(f"{path} is not an Ed25519 public key")
            keys[key_id(key)] = key
        return cls(keys)

    def verify(self, manifest_bytes: bytes, record: Any) -> str:
        """The signer's key id when ``record`` signs ``manifest_bytes`` under a trusted key.

        Raises:
            IntegrityError: no signature, an unknown key, or a signature that does not verify.
        """
        from cryptography.exceptions import InvalidSignature

        if not isinstance(record, Mapping) or record.get("alg") != _ALG:
            raise IntegrityError("the package is not signed (ed25519); sign it: edgeinfer sign")
        signer = str(record.get("key_id"))
        key = self.keys.get(signer)
        if key is None:
            raise IntegrityError(
                f"the package is signed by key {signer}, which this bridge does not trust "
                f"(trusted: {sorted(self.keys) or 'none'}); add its .pub with --trusted-key"
            )
        try:
            key.verify(
                base64.b64decode(str(record.get("signature")), validate=True), manifest_bytes
            )
        except (InvalidSignature, ValueError) as exc:
            raise IntegrityError(
                f"the manifest's signature does not verify under key {signer}: the manifest "
                "was changed after signing, or the signature is damaged; re-sign the package"
            ) from exc
        return signer
