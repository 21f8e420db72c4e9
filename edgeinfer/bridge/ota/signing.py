"""Ed25519 keys, signed statements, key rotation and revocation.

``edgeinfer keygen -o STEM`` writes ``STEM.key`` (private, PEM, mode 0600) and ``STEM.pub``;
a key id is the first 16 hex digits of the sha256 of the raw public key. What edgeinfer
signs is a *statement*: a kind (``release``, ``rollback``, ``key``) and a JSON body, signed as
``b"edgeinfer-KIND-v1\\n" + canonical JSON`` (sorted keys, no spaces), so a signature made for
one kind can never pass as another, nor as the raw ``manifest.json`` bytes that signatures of
edgeinfer before release metadata covered. A signature record::

    {"alg": "ed25519", "key_id": "<16 hex>", "chain": [<cert>, ...], "signature": "<base64>"}

**Rotation**: ``keygen -o NEW --rotate-from OLD.key`` also writes ``NEW.cert``, NEW's public
key signed by OLD (a ``key`` statement), followed by OLD's own certificates. Records signed
with NEW carry that chain, so a bridge that trusts OLD accepts NEW without a restart; at most
``MAX_CHAIN`` links. **Revocation**: a file of key ids, one a line (``#`` comments), given to
``serve --revoked``; a revoked key is refused as a signer and as any link of a chain (so
give a bridge the new key's ``.pub`` directly before revoking the key that endorsed it).
Needs the ``cryptography`` package (the ``mqtt`` extra).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from edgeinfer.errors import ConfigError, DeployRefusedError, MissingDependencyError

__all__ = [
    "MAX_CHAIN",
    "Signer",
    "TrustedKeys",
    "generate_keypair",
    "key_id",
    "read_revoked",
    "statement_bytes",
]

_ALG: Final = "ed25519"
MAX_CHAIN: Final = 4  # rotations a chain may hold: a yearly rotation for four years
_KEY_ID_CHARS = frozenset("0123456789abcdef")


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise MissingDependencyError("cryptography", "mqtt") from exc
    return ed25519


def _serialization() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization


def _raw(public_key: Any) -> bytes:
    ser = _serialization()
    return bytes(public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw))


def key_id(public_key: Any) -> str:
    """The signer's id: the first 16 hex digits of the sha256 of the raw public key."""
    return hashlib.sha256(_raw(public_key)).hexdigest()[:16]


def statement_bytes(kind: str, body: Mapping[str, Any]) -> bytes:
    """The exact bytes a ``kind`` statement with ``body`` is signed as."""
    canonical = json.dumps(dict(body), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"edgeinfer-{kind}-v1\n".encode() + canonical.encode()


def _write_private(path: Path, private: Any) -> None:
    ser = _serialization()
    pem = private.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def generate_keypair(
    stem: Path, *, overwrite: bool = False, rotate_from: Path | None = None
) -> tuple[Path, Path, str]:
    """Write ``STEM.key`` (private, PEM, mode 0600) and ``STEM.pub``; return them and the id.

    Args:
        stem: path without suffix.
        overwrite: replace existing files.
        rotate_from: an older private key that endorses the new one: writes ``STEM.cert``
            too, which ``Signer`` attaches to every signature of the new key.
    """
    ser = _serialization()
    old = None if rotate_from is None else Signer.load(rotate_from)
    key_path, pub_path = stem.with_suffix(".key"), stem.with_suffix(".pub")
    cert_path = stem.with_suffix(".cert")
    for path in (key_path, pub_path, cert_path):
        if path.exists() and not overwrite:
            raise ConfigError(f"{path} exists; pass --overwrite to replace it")
    stem.parent.mkdir(parents=True, exist_ok=True)
    private = _ed25519().Ed25519PrivateKey.generate()
    _write_private(key_path, private)
    public = private.public_key()
    pub_path.write_bytes(
        public.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    )
    if old is not None:
        body = {"key_id": key_id(public), "public_key": base64.b64encode(_raw(public)).decode()}
        record = old.sign("key", body)
        cert = {**body, "endorsed_by": record["key_id"], "signature": record["signature"]}
        chain = [cert, *old.chain]
        if len(chain) > MAX_CHAIN:
            raise ConfigError(
                f"{rotate_from} is already {len(old.chain)} rotations from a root key; bridges "
                f"follow at most {MAX_CHAIN}: give them a newer .pub with --trusted-key and "
                "rotate from that key"
            )
        cert_path.write_text(json.dumps(chain, indent=2) + "\n")
    else:
        cert_path.unlink(missing_ok=True)
    return key_path, pub_path, key_id(public)


@dataclass(frozen=True)
class Signer:
    """A private key and the certificates that lead from it to an older trusted key."""

    private_key: Any
    chain: Sequence[Mapping[str, Any]] = ()

    @classmethod
    def load(cls, path: Path) -> Signer:
        """Read ``STEM.key`` (unencrypted PEM) and ``STEM.cert`` next to it, when there."""
        ser = _serialization()
        try:
            key = ser.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"{path} is not a readable unencrypted PEM private key: {exc}"
            ) from exc
        if not isinstance(key, _ed25519().Ed25519PrivateKey):
            raise ConfigError(f"{path} is not an Ed25519 key; make one with `edgeinfer keygen`")
        cert_path = Path(path).with_suffix(".cert")
        try:
            chain = json.loads(cert_path.read_text()) if cert_path.is_file() else []
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{cert_path} is not a readable key certificate: {exc}") from exc
        if not isinstance(chain, list):
            raise ConfigError(f"{cert_path} must hold a JSON list of certificates")
        return cls(key, tuple(chain))

    @property
    def key_id(self) -> str:
        """The id of this signer's public key."""
        return key_id(self.private_key.public_key())

    def sign(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The signature record of the ``kind`` statement ``body``."""
        signature = self.private_key.sign(statement_bytes(kind, body))
        return {
            "alg": _ALG,
            "key_id": self.key_id,
            "chain": [dict(c) for c in self.chain],
            "signature": base64.b64encode(signature).decode("ascii"),
        }


def read_revoked(path: Path) -> frozenset[str]:
    """The key ids in a revocation file: one a line, ``#`` starts a comment."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the revocation list {path}: {exc}") from exc
    ids = {line.split("#", 1)[0].strip() for line in lines} - {""}
    bad = sorted(i for i in ids if len(i) != 16 or not set(i) <= _KEY_ID_CHARS)
    if bad:
        raise ConfigError(
            f"{path}: not key ids (16 hex digits, `edgeinfer keygen` prints them): {bad}"
        )
    return frozenset(ids)


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DeployRefusedError("bad_signature", "a signature is not valid base64") from exc


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a bridge accepts signatures from (by key id), and the revoked ids."""

    keys: Mapping[str, Any]
    revoked: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def load(cls, paths: Iterable[Path], *, revoked: frozenset[str] = frozenset()) -> TrustedKeys:
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
        return cls(keys, revoked)

    def verify(self, kind: str, body: Mapping[str, Any], record: Any) -> str:
        """The signer's key id when ``record`` signs the ``kind`` statement ``body`` under a
        trusted key, directly or through the record's chain of rotations.

        Raises:
            DeployRefusedError: ``unsigned``, ``untrusted``, ``revoked`` or ``bad_signature``.
        """
        if not isinstance(record, Mapping) or record.get("alg") != _ALG:
            raise DeployRefusedError("unsigned", "no ed25519 signature; sign it: edgeinfer sign")
        chain = record.get("chain") or []
        if not isinstance(chain, list):
            raise DeployRefusedError("bad_signature", "the signature's chain is not a list")
        signer = str(record.get("key_id"))
        self._check(self._key(signer, chain, 0), record.get("signature"), kind, body, signer)
        return signer

    def verify_raw(self, data: bytes, record: Mapping[str, Any]) -> str:
        """The signer of a record made before release metadata: a signature over ``data``
        itself (the manifest bytes), by a directly trusted key. Names the signer of a
        package served from the command line; deploys refuse such records (``unsigned``)."""
        signer = str(record.get("key_id"))
        if record.get("alg") != _ALG or signer in self.revoked or signer not in self.keys:
            raise DeployRefusedError("untrusted", f"key {signer} is not trusted here")
        self._verify(self.keys[signer], record.get("signature"), data, signer)
        return signer

    def _key(self, signer: str, chain: list[Any], depth: int) -> Any:
        if signer in self.revoked:
            raise DeployRefusedError(
                "revoked", f"key {signer} is revoked on this device; sign with a current key"
            )
        if signer in self.keys:
            return self.keys[signer]
        cert = next(
            (c for c in chain if isinstance(c, Mapping) and c.get("key_id") == signer), None
        )
        if cert is None or depth >= MAX_CHAIN:
            raise DeployRefusedError(
                "untrusted",
                f"signed by key {signer}, which this device does not trust (trusted: "
                f"{sorted(self.keys) or 'none'}); add its .pub with --trusted-key, or rotate "
                "to it from a trusted key (edgeinfer keygen --rotate-from)",
            )
        raw = _b64(cert.get("public_key"))
        if hashlib.sha256(raw).hexdigest()[:16] != signer:
            raise DeployRefusedError("bad_signature", f"the certificate of {signer} is not its key")
        body = {"key_id": signer, "public_key": cert.get("public_key")}
        endorser = str(cert.get("endorsed_by"))
        self._check(
            self._key(endorser, chain, depth + 1), cert.get("signature"), "key", body, endorser
        )
        try:
            return _ed25519().Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as exc:
            raise DeployRefusedError("bad_signature", f"key {signer} is not Ed25519") from exc

    def _check(
        self, key: Any, signature: Any, kind: str, body: Mapping[str, Any], signer: str
    ) -> None:
        self._verify(key, signature, statement_bytes(kind, body), signer)

    @staticmethod
    def _verify(key: Any, signature: Any, data: bytes, signer: str) -> None:
        from cryptography.exceptions import InvalidSignature

        try:
            key.verify(_b64(signature), data)
        except InvalidSignature as exc:
            raise DeployRefusedError(
                "bad_signature",
                f"the signature by key {signer} does not verify: what it signs was changed "
                "after signing, or the signature is damaged; sign it again",
            ) from exc
