"""Authenticating what a cache on disk hands back to a graph or a reply (docs/cache.md).

A cache file is trusted only as far as the folder that holds it, and a user's cache folder is
writable by more than the packages it serves: a copy from another device, a sync tool, another
account given the folder. So every cache entry that feeds a graph or a reply carries an
HMAC-SHA256 tag under a key of this device: 32 random bytes in ``<folder>/cache.key``, made on
first use with mode 0600 and read only while it is a regular file of this user that no one else
can read (not a symbolic link). An entry written by anyone without the key is refused.

What this cannot stop: a process of the same user can read the key and forge entries. That is
the trust the package folder itself is given: the same user can rewrite the package.

The tag covers a purpose (``"prepacked-entry"``, ``"result"``, ...: a tag made for one kind of
entry never passes for another) and the entry's parts, each length-prefixed, so no two
different lists of parts are tagged alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

from edgeinfer.errors import ConfigError

__all__ = ["KEY_NAME", "NOFOLLOW", "TAG_BYTES", "CacheKey", "check_private_folder", "is_own"]

KEY_NAME = "cache.key"
TAG_BYTES = 32  # HMAC-SHA256
_KEY_BYTES = 32
# Bits that let someone other than the owner read (the key) or write (a folder).
_OTHERS_RW = stat.S_IRWXG | stat.S_IRWXO
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
# Owners and mode bits are POSIX's; on Windows (no getuid, ACLs instead) they are not checked.
_POSIX = hasattr(os, "getuid")
NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)  # open flag: a symbolic link fails to open (POSIX)


class CacheKey:
    """The device key of one cache folder: tags entries and checks their tags.

    Args:
        secret: the key's 32 bytes (``CacheKey.of_folder`` reads or makes them).
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def of_folder(cls, folder: Path) -> CacheKey:
        """The key kept in ``folder`` (created, with the folder, on first use).

        Raises:
            ConfigError: the key file is a symbolic link, another user's, readable by others,
                or not a key; the message says what to remove.
        """
        path = folder / KEY_NAME
        found = _read_key(path)
        if found is None:
            _make_key(folder, path)
            found = _read_key(path)  # ours, or the one another process made first
        if found is None:
            raise ConfigError(f"{path} vanished as it was made; check who else writes {folder}")
        return cls(found)

    def tag(self, purpose: str, *parts: bytes | memoryview) -> bytes:
        """The 32-byte HMAC-SHA256 of ``parts`` for ``purpose``; a large array is tagged
        without a copy as ``memoryview(np.ascontiguousarray(a)).cast("B")``."""
        mac = hmac.new(self._secret, purpose.encode() + b"\0", hashlib.sha256)
        for part in parts:
            size = part.nbytes if isinstance(part, memoryview) else len(part)
            mac.update(size.to_bytes(8, "little"))
            mac.update(part)
        return mac.digest()

    def verify(self, tag: bytes, purpose: str, *parts: bytes | memoryview) -> bool:
        """Whether ``tag`` is this key's tag of ``parts`` for ``purpose`` (constant time)."""
        return hmac.compare_digest(tag, self.tag(purpose, *parts))


def check_private_folder(folder: Path) -> None:
    """Refuse ``folder`` (symbolic links followed) unless it is a directory of this user that
    no one else can write: in such a folder a file cannot be swapped for another by someone
    who does not hold the key.

    Raises:
        ConfigError: it is not; the message says how to fix it.
    """
    found = os.stat(folder)
    if not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"{folder} is not a folder; choose a cache folder that is")
    if not _POSIX:
        return
    if not is_own(found):
        raise ConfigError(
            f"{folder} belongs to another user (uid {found.st_uid}); choose a cache folder "
            "of your own"
        )
    if found.st_mode & _OTHERS_WRITE:
        raise ConfigError(
            f"{folder} is writable by other users (mode {stat.filemode(found.st_mode)}); "
            f"run `chmod go-w {folder}` or choose another cache folder"
        )


def is_own(found: os.stat_result) -> bool:
    """Whether the file of this status belongs to this process's user (always, off POSIX)."""
    return not _POSIX or found.st_uid == os.getuid()


def _read_key(path: Path) -> bytes | None:
    """The key in ``path``, or None when there is no such file."""
    try:  # O_NONBLOCK: a FIFO in its place does not block the open
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symbolic link
        raise ConfigError(
            f"cannot use the cache key {path} ({exc.strerror}: it must be a regular file, not "
            "a link). Remove it and a new key is made (the cache's entries are then rebuilt)"
        ) from exc
    try:
        found = os.fstat(fd)
        problem = _key_problem(found)
        secret = os.read(fd, _KEY_BYTES + 1) if problem is None else b""
    finally:
        os.close(fd)
    if problem is None and len(secret) != _KEY_BYTES:
        problem = f"it holds {len(secret)} bytes, not a {_KEY_BYTES}-byte key"
    if problem is not None:
        raise ConfigError(
            f"cannot use the cache key {path}: {problem}. Remove it and a new key is made "
            "(the cache's entries are then rebuilt)"
        )
    return secret


def _key_problem(found: os.stat_result) -> str | None:
    """Why a key file with this status cannot be trusted, or None."""
    if not stat.S_ISREG(found.st_mode):
        return "it is not a regular file"
    if not is_own(found):
        return f"it belongs to another user (uid {found.st_uid})"
    if _POSIX and found.st_mode & _OTHERS_RW:
        return f"others may read it (mode {stat.filemode(found.st_mode)})"
    return None


def _make_key(folder: Path, path: Path) -> None:
    """Write a new key to ``path`` atomically: a whole 0600 file appears, or none (a key
    another process made meanwhile is kept)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{KEY_NAME}-")  # mode 0600
    try:
        try:
            os.write(fd, secrets.token_bytes(_KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process's key won
            os.link(temp, path)
    finally:
        os.unlink(temp)
