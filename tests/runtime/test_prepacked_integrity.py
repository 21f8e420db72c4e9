"""A prepack cache cannot change what a verified package computes: an entry is bound to its
package and tagged with the cache folder's device key, what onnxruntime maps is what was
checked, and links in place of the folder or an entry are refused or followed safely."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

import edgeinfer
from edgeinfer.manifest import sha256_file
from edgeinfer.runtime.cache.integrity import KEY_NAME

TEXTS = ["pump valve pressure rising", "motor vibration high"]


@pytest.fixture(scope="module")
def other_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package of the same shape as ``fast_encoder`` with other weights."""
    from fast_packages import tiny_encoder

    return tiny_encoder(tmp_path_factory.mktemp("other") / "tiny-encoder", seed=1)


def _config(cache: Path) -> edgeinfer.RuntimeConfig:
    return edgeinfer.RuntimeConfig(
        threads=1, warmup_runs=0, file_backed_prepacks=True, prepack_cache_dir=cache
    )


def _embed(package: Path, config: edgeinfer.RuntimeConfig) -> np.ndarray:
    model = edgeinfer.load(package, config=config)
    try:
        return model.embed(TEXTS)
    finally:
        model.close()


def _plain(package: Path) -> np.ndarray:
    return _embed(package, edgeinfer.RuntimeConfig(threads=1, warmup_runs=0))


def _entry(cache: Path) -> Path:
    [entry] = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return entry


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def _substitute(entry: Path, other: Path) -> None:
    """The issue's attack: another package's entry copied over this one's, its record given
    this entry's identity and every file's sha256 and size recomputed."""
    identity = json.loads((entry / "entry.json").read_text())["identity"]
    shutil.rmtree(entry)
    shutil.copytree(other, entry)
    record = json.loads((entry / "entry.json").read_text())
    record["identity"] = identity
    for name, listed in record["files"].items():
        listed.update(sha256=sha256_file(entry / name), bytes=(entry / name).stat().st_size)
    (entry / "entry.json").write_text(json.dumps(record))


def test_another_packages_entry_copied_over_this_ones_is_refused_and_rebuilt(
    fast_encoder: Path, other_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own, others = _plain(fast_encoder), _plain(other_encoder)
    assert _cosine(own[0], others[0]) < 0.9  # two packages that answer apart
    _embed(fast_encoder, _config(tmp_path / "mine"))
    _embed(other_encoder, _config(tmp_path / "theirs"))
    _substitute(_entry(tmp_path / "mine"), _entry(tmp_path / "theirs"))
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        served = _embed(fast_encoder, _config(tmp_path / "mine"))
    np.testing.assert_array_equal(served, own)  # the old code served the other's: cosine 1.0
    [refused] = [r.getMessage() for r in caplog.records]
    assert "its tag does not match this folder's key" in refused
    rebuilt = json.loads((_entry(tmp_path / "mine") / "entry.json").read_text())
    assert rebuilt["identity"]["package"] == edgeinfer.Manifest.read(fast_encoder).digest
    np.testing.assert_array_equal(_embed(fast_encoder, _config(tmp_path / "mine")), own)


def test_an_intact_entry_of_another_package_renamed_to_this_ones_is_refused(
    fast_encoder: Path, other_encoder: Path, tmp_path: Path
) -> None:
    own = _plain(fast_encoder)
    _embed(fast_encoder, _config(tmp_path))
    mine = _entry(tmp_path)
    _embed(other_encoder, _config(tmp_path))
    [theirs] = [p for p in tmp_path.iterdir() if p.is_dir() and p.name[0] != "." and p != mine]
    shutil.rmtree(mine)
    theirs.rename(mine)  # its record and tag untouched: right for the other package
    np.testing.assert_array_equal(_embed(fast_encoder, _config(tmp_path)), own)


def _swapping_before_the_load(
    monkeypatch: pytest.MonkeyPatch, cache: Path, swap: Callable[[], None]
) -> list[str]:
    """Run ``swap`` once, after the entry's check and before onnxruntime opens the copy
    (the first session opened from inside ``cache``); the paths sessions were opened from."""
    real = ort.InferenceSession
    opened: list[str] = []

    def session(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(cache)) and not opened:
            swap()
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", session)
    return opened


def test_a_file_swapped_between_the_check_and_the_load_is_never_read(
    fast_encoder: Path,
    other_encoder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = _plain(fast_encoder)
    cache = (tmp_path / "mine").resolve()
    _embed(fast_encoder, _config(cache))
    _embed(other_encoder, _config(tmp_path / "theirs"))
    data = _entry(cache) / "model.onnx.data"
    foreign = _entry(tmp_path / "theirs") / "model.onnx.data"
    assert foreign.stat().st_size == data.stat().st_size  # a swap the size check cannot see

    def swap() -> None:  # another file renamed over the checked one's name
        shutil.copy(foreign, tmp_path / "swapped")
        os.replace(tmp_path / "swapped", data)

    opened = _swapping_before_the_load(monkeypatch, cache, swap)
    served = _embed(fast_encoder, _config(cache))
    np.testing.assert_array_equal(served, own)  # the old code loaded the swapped file
    assert sha256_file(data) == sha256_file(foreign)  # the swap did happen, under the entry
    assert not opened[0].startswith(str(_entry(cache)))  # a private copy of the names was
    monkeypatch.undo()
    np.testing.assert_array_equal(_embed(fast_encoder, _config(cache)), own)  # found, rebuilt


def test_a_symlinked_cache_folder_is_followed_and_its_target_checked(
    fast_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = _plain(fast_encoder)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    np.testing.assert_array_equal(_embed(fast_encoder, _config(tmp_path / "link")), own)
    assert _entry(real).is_dir() and (real / KEY_NAME).is_file()
    real.chmod(0o777)  # now others may write the folder the link names
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        np.testing.assert_array_equal(_embed(fast_encoder, _config(tmp_path / "link")), own)
    assert "is writable by other users" in caplog.text and "chmod go-w" in caplog.text


def test_an_entry_that_is_a_symlink_is_removed_as_a_link_and_rebuilt(
    fast_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = _plain(fast_encoder)
    cache = tmp_path / "cache"
    _embed(fast_encoder, _config(cache))
    entry = _entry(cache)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)  # an intact entry, tag and all, reached through a link
    entry.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        np.testing.assert_array_equal(_embed(fast_encoder, _config(cache)), own)
    assert "it is a link or not a folder" in caplog.text
    assert not entry.is_symlink() and (entry / "entry.json").is_file()
    assert (elsewhere / "entry.json").is_file()  # what the link named is left alone


def test_a_file_of_an_entry_that_is_a_symlink_is_refused(
    fast_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = _plain(fast_encoder)
    _embed(fast_encoder, _config(tmp_path))
    data = _entry(tmp_path) / "model.onnx.data"
    kept = tmp_path / "kept.data"
    shutil.copy(data, kept)  # the very bytes, reached through a link
    data.unlink()
    data.symlink_to(kept)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        np.testing.assert_array_equal(_embed(fast_encoder, _config(tmp_path)), own)
    assert "model.onnx.data:" in caplog.text and "building it again" in caplog.text
    assert not data.is_symlink()


@pytest.mark.parametrize("flaw", ["readable by others", "a symlink"])
def test_a_key_that_cannot_be_trusted_leaves_the_package_graph_loading(
    fast_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, flaw: str
) -> None:
    own = _plain(fast_encoder)
    _embed(fast_encoder, _config(tmp_path))
    key = tmp_path / KEY_NAME
    if flaw == "readable by others":
        key.chmod(0o644)
    else:
        key.rename(tmp_path / "real.key")
        key.symlink_to(tmp_path / "real.key")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        np.testing.assert_array_equal(_embed(fast_encoder, _config(tmp_path)), own)
    assert f"cannot use the cache key {key}" in caplog.text and "Remove it" in caplog.text
