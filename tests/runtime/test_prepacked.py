"""File-backed prepacks (``RuntimeConfig(file_backed_prepacks=True)``): the first load writes
the graph with this CPU's prepacks into the cache, later loads map it, the answers are the
package's own; an entry made for another CPU or onnxruntime is never read, a damaged one is
rebuilt, and a cache that cannot be written leaves the package's graph loading. A cache cannot
change what a verified package computes: another package's entry copied over this one's, a
file swapped between the check and the load, links in place of the folder or an entry
(tests/runtime/test_prepacked_integrity.py)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.runtime import prepacked


def _config(cache: Path, **fields: object) -> edgeinfer.RuntimeConfig:
    return edgeinfer.RuntimeConfig(
        threads=1, warmup_runs=0, file_backed_prepacks=True, prepack_cache_dir=cache, **fields
    )


def _greedy(package: Path, config: edgeinfer.RuntimeConfig) -> tuple[int, ...]:
    model = edgeinfer.load(package, config=config)
    try:
        return model.generate("pump valve pressure", max_new_tokens=12).token_ids
    finally:
        model.close()


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_the_first_load_writes_the_prepacks_and_later_loads_map_them(
    fast_decoder: Path, tmp_path: Path
) -> None:
    plain = _greedy(fast_decoder, edgeinfer.RuntimeConfig(threads=1, warmup_runs=0))
    assert _greedy(fast_decoder, _config(tmp_path)) == plain
    [entry] = _entries(tmp_path)
    record = json.loads((entry / "entry.json").read_text())
    assert record["identity"]["cpu"] == prepacked.cpu_fingerprint()
    # the packed panels are written beside the weights: more bytes than the package's data
    packaged = (fast_decoder / "model.onnx.data").stat().st_size
    assert record["files"]["model.onnx.data"]["bytes"] > packaged
    built = (entry / "model.onnx.data").stat().st_ino
    assert _greedy(fast_decoder, _config(tmp_path)) == plain
    assert _entries(tmp_path) == [entry] and (entry / "model.onnx.data").stat().st_ino == built
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no link folder left


def test_an_entry_made_for_another_cpu_is_never_read(
    fast_decoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _greedy(fast_decoder, _config(tmp_path))
    here = prepacked.cpu_fingerprint()
    monkeypatch.setattr(prepacked, "cpu_fingerprint", lambda: "x86_64:avx2 fma sse4_2")
    assert _greedy(fast_decoder, _config(tmp_path)) == plain
    cpus = {
        json.loads((e / "entry.json").read_text())["identity"]["cpu"] for e in _entries(tmp_path)
    }
    assert cpus == {here, "x86_64:avx2 fma sse4_2"}


def test_a_damaged_entry_is_built_again(
    fast_decoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plain = _greedy(fast_decoder, _config(tmp_path))
    [entry] = _entries(tmp_path)
    data = entry / "model.onnx.data"
    data.chmod(0o644)  # the cache keeps its files read-only
    with data.open("r+b") as f:  # one flipped byte, the size unchanged
        f.seek(data.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        assert _greedy(fast_decoder, _config(tmp_path)) == plain
    assert "cannot be used (model.onnx.data's sha256 differs" in caplog.text
    record = json.loads((entry / "entry.json").read_text())
    from edgeinfer.manifest import sha256_file

    assert sha256_file(data) == record["files"]["model.onnx.data"]["sha256"]


def test_a_cache_that_cannot_be_written_loads_the_package_graph(
    fast_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    texts = ["pump valve pressure rising", "motor vibration high"]
    plain = edgeinfer.load(fast_encoder, config=edgeinfer.RuntimeConfig(threads=1)).embed(texts)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.prepacked"):
        model = edgeinfer.load(fast_encoder, config=_config(blocked / "cache"))
    assert "cannot use prepacked weights" in caplog.text
    np.testing.assert_array_equal(model.embed(texts), plain)


def test_an_encoder_with_file_backed_prepacks_embeds_the_same(
    fast_encoder: Path, tmp_path: Path
) -> None:
    texts = ["pump valve pressure rising", "the tank level is steady"]
    plain = edgeinfer.load(fast_encoder, config=edgeinfer.RuntimeConfig(threads=1)).embed(texts)
    backed = edgeinfer.load(fast_encoder, config=_config(tmp_path)).embed(texts)
    np.testing.assert_array_equal(backed, plain)
    assert [e.name.split("-")[0] for e in _entries(tmp_path)] == ["model"]


_ANONYMOUS = """
import json, sys
from pathlib import Path
import edgeinfer
from edgeinfer.runtime import memory
backed = sys.argv[2] != "-"
cache = Path(sys.argv[2]) if backed else None
config = edgeinfer.RuntimeConfig(threads=2, file_backed_prepacks=backed, prepack_cache_dir=cache)
model = edgeinfer.load(sys.argv[1], config=config)
ids = model.generate("Write a short story about a robot.", max_new_tokens=16).token_ids
print(json.dumps({"anonymous": memory.anonymous_bytes(), "ids": list(ids)}))
"""


def _fresh(package: Path, cache: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _ANONYMOUS, str(package), cache],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.long
def test_smollm2s_prepacks_leave_anonymous_memory(smollm2_package: Path, tmp_path: Path) -> None:
    plain = _fresh(smollm2_package, "-")
    _fresh(smollm2_package, str(tmp_path))  # builds the entry
    backed = _fresh(smollm2_package, str(tmp_path))
    assert backed["ids"] == plain["ids"]
    # ~170 MB of int8 blocks with their scales and sums move into file pages
    assert plain["anonymous"] - backed["anonymous"] > 100 * 2**20


def test_the_cache_keeps_the_most_recently_used_entries(fast_decoder: Path, tmp_path: Path) -> None:
    _greedy(fast_decoder, _config(tmp_path))
    [real] = _entries(tmp_path)
    for i in range(prepacked._KEEP_ENTRIES + 2):  # older entries of other graphs
        old = tmp_path / f"other-{i}"
        shutil.copytree(real, old)
        os.utime(old / "entry.json", ns=(10**9 * (i + 1),) * 2)
    shutil.rmtree(real)
    _greedy(fast_decoder, _config(tmp_path))  # builds again, then prunes
    left = {e.name for e in _entries(tmp_path)}
    assert len(left) == prepacked._KEEP_ENTRIES and real.name in left
    newest = {f"other-{i}" for i in range(3, prepacked._KEEP_ENTRIES + 2)}
    assert left - {real.name} == newest  # the least recently used went


@pytest.mark.parametrize(
    "record",
    [
        "not json",
        '["a list"]',
        '{"files": ["model.onnx"], "identity": {}}',
        '{"files": {"model.onnx": "a string"}, "identity": {}}',
        '{"files": {"../../model.onnx": {"bytes": 1, "sha256": "0"}}, "identity": {}}',
    ],
)
def test_a_hostile_entry_record_is_rebuilt(fast_decoder: Path, tmp_path: Path, record: str) -> None:
    plain = _greedy(fast_decoder, _config(tmp_path))
    [entry] = _entries(tmp_path)
    (entry / "entry.json").write_text(record)
    assert _greedy(fast_decoder, _config(tmp_path)) == plain
    assert "model.onnx" in json.loads((entry / "entry.json").read_text())["files"]  # rebuilt
