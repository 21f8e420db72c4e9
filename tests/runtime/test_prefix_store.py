"""The on-disk prefix KV cache: a restart reuses a system prompt's keys/values, greedy output
equals the no-cache output, another package or prefix never reuses them, a damaged file is
deleted and recomputed, the folder stays under its size bound."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from kv_io import decoder_io

from edgeinfer.config import PrefixCacheConfig, RuntimeConfig
from edgeinfer.manifest import FileEntry, Manifest, sha256_file
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.prefix_store import PrefixStore

SYSTEM = "You answer for the bottling plant. Valves are numbered from the tank outwards."
CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Where is valve seven?"},
]
RESTART = """
import json, sys
from pathlib import Path
from edgeinfer.config import PrefixCacheConfig, RuntimeConfig
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator

package, folder, chat = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
gen = Generator(package, Manifest.read(package), config=RuntimeConfig(threads=1),
                context_length=128, prefix_cache=PrefixCacheConfig(directory=folder))
result = gen.generate(chat, max_new_tokens=8)
print(json.dumps({"text": result.text, "prompt_tokens": result.prompt_tokens,
                  "reused": gen.prefix_reused, "from_disk": gen.prefix_from_disk}))
"""


def generator(package: Path, folder: Path | None) -> Generator:
    cache = None if folder is None else PrefixCacheConfig(directory=folder)
    return Generator(
        package,
        Manifest.read(package),
        config=RuntimeConfig(threads=1),
        context_length=128,
        prefix_cache=cache,
    )


def prefix_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("prefix-*.npz"))


def test_a_restart_reuses_the_stored_system_prompt(fast_decoder: Path, tmp_path: Path) -> None:
    """Two processes in turn: the first prefills everything and stores the system prompt, the
    second loads it and prefills only the rest; both answer as a generator without the cache."""
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", RESTART, str(fast_decoder), str(tmp_path), json.dumps(CHAT)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    plain = generator(fast_decoder, None)
    expected = plain.generate(CHAT, max_new_tokens=8).text
    system = len(plain._system_ids(CHAT, plain.encode(CHAT)))
    assert first["from_disk"] == first["reused"] == 0
    assert second["from_disk"] == system > 10
    assert second["reused"] >= system  # prefilled: prompt_tokens - reused tokens, not all
    assert first["text"] == second["text"] == expected
    assert len(prefix_files(tmp_path)) == 1


def test_another_package_or_prefix_never_reuses_it(fast_decoder: Path, tmp_path: Path) -> None:
    """A package with another digest (same weights, a re-serialized tokenizer file) and a
    different system prompt both miss; a file renamed to another prefix's name is refused."""
    folder = tmp_path / "kv"
    gen = generator(fast_decoder, folder)
    expected = gen.generate(CHAT, max_new_tokens=8).text
    assert len(prefix_files(folder)) == 1

    twin = tmp_path / "twin"
    shutil.copytree(fast_decoder, twin)
    manifest = Manifest.read(twin)
    tokenizer = twin / manifest.io.tokenizer
    tokenizer.write_text(json.dumps(json.loads(tokenizer.read_text()), indent=1))
    files = dict(manifest.files)
    files[manifest.io.tokenizer] = FileEntry(
        sha256=sha256_file(tokenizer), bytes=tokenizer.stat().st_size
    )
    replace(manifest, files=files).write(twin)
    assert Manifest.read(twin).digest != manifest.digest
    other = generator(twin, folder)
    assert other.generate(CHAT, max_new_tokens=8).text == expected
    assert other.prefix_from_disk == 0 and other.prefix_reused == 0
    assert len(prefix_files(folder)) == 2  # the twin stored its own

    changed = [{"role": "system", "content": SYSTEM + " Pressure above six bar stops it."}]
    changed.append(CHAT[1])
    fresh = generator(fast_decoder, folder)
    fresh_text = fresh.generate(changed, max_new_tokens=8).text
    assert fresh.prefix_from_disk == 0
    # Put the first prompt's file under the changed prompt's name: refused, then recomputed.
    store = fresh._store
    assert store is not None
    ids, changed_ids = (fresh._system_ids(c, fresh.encode(c)) for c in (CHAT, changed))
    shutil.copy(store.path(ids), store.path(changed_ids))
    again = generator(fast_decoder, folder)
    assert again.generate(changed, max_new_tokens=8).text == fresh_text
    assert again.prefix_from_disk == 0
    loaded = store.load(changed_ids)  # rewritten by the generation above
    assert loaded is not None and loaded.shape[2] == len(changed_ids)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty"])
def test_a_damaged_file_is_deleted_and_recomputed(
    fast_decoder: Path, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    gen = generator(fast_decoder, tmp_path)
    expected = gen.generate(CHAT, max_new_tokens=8).text
    (path,) = prefix_files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        middle = len(data) // 2  # inside the keys/values: the zip's CRC-32 must catch it
        data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    elif damage == "garbage":
        data = bytearray(b"not a zip file" * 100)
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    restarted = generator(fast_decoder, tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.generate.prefix_store"):
        assert restarted.generate(CHAT, max_new_tokens=8).text == expected
    assert restarted.prefix_from_disk == 0
    assert "deleting it" in caplog.text
    assert generator(fast_decoder, tmp_path).generate(CHAT, max_new_tokens=8).text == expected
    (path,) = prefix_files(tmp_path)  # stored again, whole


def test_warm_prefix_loads_a_plain_prefix_after_a_restart(
    fast_decoder: Path, tmp_path: Path
) -> None:
    """``warm_prefix`` stores a plain-text prefix; a new generator loads it and its logits
    equal a fresh full prefill's."""
    prefix = "Sensor log of line three.\n"
    prompt = prefix + "Valve seven reads 6.2 bar; the line"
    first = generator(fast_decoder, tmp_path)
    count = first.warm_prefix(prefix)
    assert first.prefix_from_disk == 0 and count == len(first.encode(prefix))
    second = generator(fast_decoder, tmp_path)
    assert second.warm_prefix(prefix) == count and second.prefix_from_disk == count
    ids = second.encode(prompt)
    assert ids[:count] == second.encode(prefix)
    answer = second.generate(prompt, max_new_tokens=8)
    assert second.prefix_reused == count
    assert (
        answer.token_ids
        == generator(fast_decoder, None).generate(prompt, max_new_tokens=8).token_ids
    )


def test_the_store_evicts_the_least_recently_used_past_max_bytes(tmp_path: Path) -> None:
    io = decoder_io(layers=2, kv_heads=2, head_dim=8)
    kv = np.random.default_rng(0).standard_normal((4, 2, 16, 8)).astype(np.float32)
    prefixes = [list(range(i, i + 16)) for i in range(3)]
    unbounded = PrefixStore(tmp_path, package_digest="a" * 64, io=io, max_bytes=2**30)
    unbounded.save(prefixes[0], kv)
    one = unbounded.path(prefixes[0]).stat().st_size  # every file here has this size
    store = PrefixStore(tmp_path, package_digest="a" * 64, io=io, max_bytes=2 * one + one // 2)
    store.save(prefixes[1], kv + 1)
    older = store.path(prefixes[0]).stat().st_mtime_ns - 10**9
    os.utime(store.path(prefixes[1]), ns=(older, older))  # prefixes[1] is now the oldest
    store.save(prefixes[2], kv + 2)  # over the bound: the least recently used goes
    assert store.load(prefixes[1]) is None
    np.testing.assert_array_equal(store.load(prefixes[0]), kv)
    np.testing.assert_array_equal(store.load(prefixes[2]), kv + 2)
    assert sum(p.stat().st_size for p in prefix_files(tmp_path)) <= store.max_bytes
    small = PrefixStore(tmp_path / "small", package_digest="a" * 64, io=io, max_bytes=100)
    small.save(prefixes[0], kv)  # larger than the whole bound: not stored
    assert small.load(prefixes[0]) is None


def test_load_takes_the_prefix_cache_for_generate_packages_only(
    fast_decoder: Path, fast_encoder: Path, tmp_path: Path
) -> None:
    import edgeinfer
    from edgeinfer.errors import ConfigError

    config = PrefixCacheConfig(directory=tmp_path)
    first = edgeinfer.load(fast_decoder, threads=1, prefix_cache=config)
    text = first.generate(CHAT, max_new_tokens=6).text
    assert len(prefix_files(tmp_path)) == 1
    again = edgeinfer.load(fast_decoder, threads=1, prefix_cache=config)
    assert again.generate(CHAT, max_new_tokens=6).text == text
    assert again.warm_prefix("Shift report.\n") > 0 and len(prefix_files(tmp_path)) == 2
    with pytest.raises(ConfigError, match="prefix_cache serves generate packages"):
        edgeinfer.load(fast_encoder, prefix_cache=config)


@pytest.mark.parametrize("forgery", ["another device's file", "keys/values rewritten"])
def test_a_forged_entry_is_refused_and_recomputed(
    fast_decoder: Path, tmp_path: Path, forgery: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two stores of one package and prefix: a file the other device wrote, or one whose
    keys/values were rewritten with a valid zip around them, lands under this store's name;
    it is refused (its tag is not this device's), deleted and recomputed."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    expected = generator(fast_decoder, here).generate(CHAT, max_new_tokens=8).text
    (own,) = prefix_files(here)
    assert generator(fast_decoder, elsewhere).generate(CHAT, max_new_tokens=8).text == expected
    (theirs,) = prefix_files(elsewhere)
    assert theirs.name == own.name  # the same package and prefix: the same name
    if forgery == "another device's file":
        shutil.copy(theirs, own)
    else:
        with np.load(own, allow_pickle=False) as data:
            parts = {name: data[name] for name in data.files}
        parts["kv"] = parts["kv"] * 2  # attention fed other keys/values, the tag kept
        with open(own, "wb") as f:
            np.savez(f, **parts)
    restarted = generator(fast_decoder, here)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.generate.prefix_store"):
        assert restarted.generate(CHAT, max_new_tokens=8).text == expected
    assert restarted.prefix_from_disk == 0
    assert "not tagged by this device's cache key" in caplog.text
    again = generator(fast_decoder, here)  # stored again, with this device's tag
    assert again.generate(CHAT, max_new_tokens=8).text == expected
    assert again.prefix_from_disk > 0
