"""Deploy state that survives faults: a state file that is empty, truncated or garbage is
rebuilt from the package folders with a warning; and a deploy folder on a tiny tmpfs, filled
so that each step (staging, chunks, the log, the rename, the state write) runs out of space
in turn, never leaves a status that disagrees with what serves, nor a restart that crashes
or serves something else.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_harness import Harness, Mosquitto
from deploy_harness import DEVICE, Operator, deploy_bridge, keypair, release

import edgeinfer
from edgeinfer.bridge import Bridge, Connection, TrustedKeys, deploy_package
from edgeinfer.bridge.ota.state import (
    STATE_NAME,
    Kept,
    Names,
    NameState,
    load_state,
    write_atomic,
)
from edgeinfer.errors import EdgeInferError
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.smoke import check

ITERATIONS = 20
PAGE = 4096  # tmpfs hands out space in pages
# Staging the accumulator package takes ~8 pages (its files, signature, staging records).


def _free_pages(i: int) -> tuple[int, int | None]:
    """Iteration ``i``'s free pages before the deploy, and just before its state is written
    (``None``: not filled again): it runs out in begin, in staging or between the chunks
    (0 .. 7 pages), at the state write (0 left then), or not at all."""
    step = i % 12
    if step < 8:
        return step, None
    return 16, 0 if step < 11 else None


TMPFS_BYTES = 256 << 10  # room for ~3 copies of the accumulator package, staging and state


def _folder_with_two_releases(tmp_path: Path, raw_package: Path) -> tuple[Path, Path, Path]:
    """``NAME/`` with releases v2 and v3 of the raw package kept, as a deploy leaves them."""
    key, _ = keypair(tmp_path / "keys", "release")
    folder = tmp_path / "deployed" / "acc"
    folder.mkdir(parents=True)
    kept = []
    for version in (2, 3):
        package = release(raw_package, tmp_path, version, key=key)
        kept.append(shutil.copytree(package, folder / f"v{version}"))
    return folder, kept[0], kept[1]


@pytest.mark.parametrize("damage", [b"", b'{"active": {"path": "/x", "dig', b"\xff\x00garbage"])
def test_a_damaged_state_file_is_rebuilt_from_the_folders(
    tmp_path: Path, raw_package: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    folder, v2, v3 = _folder_with_two_releases(tmp_path, raw_package)
    (folder / STATE_NAME).write_bytes(damage)
    with caplog.at_level(logging.WARNING):
        state = load_state(folder)
    assert state.recovered and "rebuilt from the package folders" in caplog.text
    assert state.active is not None and Path(state.active.path) == v3  # the highest version
    assert state.previous is not None and Path(state.previous.path) == v2
    assert state.floor_version == 3  # never lower than what was accepted
    names = Names(folder.parent, origins={}, trusted=TrustedKeys({}))
    restored = names.restore(_raw_loader, skip="staging")  # what a restarted bridge does
    assert restored["acc"].manifest.digest == Manifest.read(v3).digest
    assert NameState.from_json((folder / STATE_NAME).read_bytes()).active == state.active


def test_a_state_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / STATE_NAME
    first = NameState(active=Kept(path="/a", digest="a", version=1), floor_version=1)
    write_atomic(path, first.to_json())
    second = NameState(active=Kept(path="/b", digest="b", version=2), floor_version=2)
    write_atomic(path, second.to_json())
    assert NameState.from_json(path.read_bytes()) == second
    assert [p.name for p in tmp_path.iterdir()] == [STATE_NAME]  # no temporary file left


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tiny tmpfs mounted as the deploy folder (root only; skipped where mount is refused)."""
    folder = tmp_path / "deployed"
    folder.mkdir()
    size = f"size={TMPFS_BYTES // 1024}k"
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def _raw_loader(path: Path) -> edgeinfer.Model:
    return edgeinfer.load(path, config=edgeinfer.RuntimeConfig(spin_wait=False, threads=1))


def _served(bridge: Bridge) -> str:
    """What ``acc`` is served by, after checking the status topic says the same."""
    model = bridge.models.get("acc")
    assert model is not None
    digest = str(model.manifest.digest)
    assert bridge.status()["models"]["acc"]["digest"] == digest
    return digest


def _fill(folder: Path, free_bytes: int) -> None:
    """Leave ``free_bytes`` free on ``folder``'s file system (one filler file)."""
    filler = folder / "filler"
    filler.unlink(missing_ok=True)
    size = shutil.disk_usage(folder).free - free_bytes
    if size > 0:
        with filler.open("wb") as f:
            f.write(bytes(size))


@pytest.mark.slow
def test_a_full_disk_never_leaves_a_status_that_disagrees_with_what_serves(
    broker: Mosquitto, harness: Harness, raw_package: Path, tmpfs: Path, tmp_path: Path
) -> None:
    key, pub = keypair(tmp_path / "keys", "release")
    late: list[int | None] = [None]  # free pages to leave once loaded (before the state write)

    def loader(path: Path) -> edgeinfer.Model:
        model = _raw_loader(path)
        if late[0] is not None:
            _fill(tmpfs, late[0] * PAGE)
        return model

    def bridge() -> Bridge:  # a (re)started bridge on the same deploy folder
        return deploy_bridge(
            broker,
            harness,
            tmpfs,
            trusted=[pub],
            origin=raw_package,
            loader=loader,
            smoke_check=check,
            model=_raw_loader(raw_package),
            name="acc",
        )

    outcomes: dict[str, int] = {}
    operator = Operator(broker.port)
    current = bridge()
    try:
        for i in range(ITERATIONS):
            package = release(raw_package, tmp_path, i + 2, key=key, sign_options=("--name", "acc"))
            early, late[0] = _free_pages(i)
            _fill(tmpfs, early * PAGE)
            before = _served(current)
            try:
                status = deploy_package(
                    package,
                    connection=Connection(broker=broker.url, client_id=f"op-disk-{i}"),
                    device_id=DEVICE,
                    chunk_bytes=1024,  # several chunks per file: the disk fills between them
                    timeout_s=60,
                ).status
            except EdgeInferError as exc:
                pytest.fail(f"iteration {i}: no final status: {exc}")
            outcomes[status["state"]] = outcomes.get(status["state"], 0) + 1
            served = _served(current)
            if status["state"] == "active":
                assert served == Manifest.read(package).digest
            else:  # failed or refused: the old package serves, nothing is left staged
                assert served == before, status
                assert not (tmpfs / "staging").exists()
            late[0] = None
            current.stop()
            current = bridge()  # restarted on the same (still full) folder
            assert _served(current) == served
        (tmpfs / "filler").unlink()
        assert operator.retained()["state"] in ("active", "failed")
    finally:
        current.stop()
        operator.close()
    assert outcomes.get("active", 0) >= 1 and len(outcomes) >= 2, outcomes  # both happened
