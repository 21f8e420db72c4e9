"""The device key of a cache folder: made once, atomically, readable by its owner alone; a key
file that could be someone else's is refused with what to do; tags bind purpose and parts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.errors import ConfigError
from edgeinfer.runtime.cache.integrity import KEY_NAME, CacheKey, check_private_folder


def test_the_key_is_made_once_readable_by_its_owner_alone(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "cache"
    first = CacheKey.of_folder(folder)
    key = folder / KEY_NAME
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0
    assert CacheKey.of_folder(folder).tag("p", b"x") == first.tag("p", b"x")  # the same key
    assert [p.name for p in folder.iterdir()] == [KEY_NAME]  # no temporary file left


def test_tags_bind_the_purpose_and_each_part(tmp_path: Path) -> None:
    key = CacheKey.of_folder(tmp_path)
    tag = key.tag("result", b"ab", b"c")
    assert key.verify(tag, "result", b"ab", b"c")
    assert not key.verify(tag, "prepacked-entry", b"ab", b"c")
    assert not key.verify(tag, "result", b"a", b"bc")  # parts are length-prefixed
    assert not key.verify(tag, "result", b"abc")
    assert not CacheKey.of_folder(tmp_path / "other").verify(tag, "result", b"ab", b"c")


def test_an_array_is_tagged_as_its_bytes_without_a_copy(tmp_path: Path) -> None:
    key = CacheKey.of_folder(tmp_path)
    kv = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    assert key.tag("p", memoryview(kv).cast("B")) == key.tag("p", kv.tobytes())
    assert key.tag("p", memoryview(kv)) == key.tag("p", kv.tobytes())  # counted in bytes


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda key: key.chmod(0o644), "others may read it"),
        (lambda key: key.write_bytes(b"short"), "not a 32-byte key"),
        (lambda key: (key.unlink(), os.mkfifo(key, 0o600)), "not a regular file"),
        (lambda key: (key.unlink(), key.symlink_to(key.with_name("x"))), "not a link"),
    ],
)
def test_a_key_file_that_cannot_be_trusted_is_refused(
    tmp_path: Path, make: object, problem: str
) -> None:
    CacheKey.of_folder(tmp_path)
    make(tmp_path / KEY_NAME)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=problem) as refused:
        CacheKey.of_folder(tmp_path)
    assert "Remove it" in str(refused.value)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_key_of_another_user_is_refused(tmp_path: Path) -> None:
    CacheKey.of_folder(tmp_path)
    os.chown(tmp_path / KEY_NAME, 4321, -1)
    with pytest.raises(ConfigError, match="belongs to another user"):
        CacheKey.of_folder(tmp_path)


def test_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    check_private_folder(tmp_path)
    tmp_path.chmod(0o775)
    with pytest.raises(ConfigError, match="chmod go-w"):
        check_private_folder(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a folder"):
        check_private_folder(tmp_path / "file")
