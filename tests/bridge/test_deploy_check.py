"""The bounded deploy check on its own (``ota/check.py`` and its child ``ota/checker.py``): a
benign package passes and its child's usage is reported; a failure in the child comes back
as the edgeinfer error it raised; a decoder's hostile ``tokenizer.model`` is parsed by
sentencepiece's C++ in the child, not in the bridge; a release can lower a device's limits,
never raise them, and carries them signed only when it has them.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from deploy_harness import keypair
from hostile_packages import benign_encoder

from edgeinfer.bridge import DeployConfig, TrustedKeys, sign_package
from edgeinfer.bridge.ota.check import BoundedCheck, CheckLimits
from edgeinfer.bridge.ota.release import Release
from edgeinfer.errors import ConfigError, IntegrityError, PackageError
from edgeinfer.manifest import MANIFEST_NAME, Manifest, file_entries

LIMITS = CheckLimits(timeout_s=300)  # a hang guard: these checks pass or fail on their own


def test_a_benign_package_passes_and_its_usage_is_reported(tmp_path: Path) -> None:
    check = BoundedCheck()
    report = check.run(benign_encoder(tmp_path / "pkg"), LIMITS)
    assert check.last == report
    assert report.cpu_s > 0 and report.max_rss_bytes > 0
    assert set(report.fields()) == {"wall_s", "cpu_s", "max_rss_mb", "timeout_s", "memory_mb"}


def test_a_failure_in_the_child_comes_back_as_its_error_class(tmp_path: Path) -> None:
    package = benign_encoder(tmp_path / "pkg")
    graph = package / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[-1] ^= 0xFF  # same size, another sha256: load(verify=True) refuses it in the child
    graph.write_bytes(bytes(data))
    check = BoundedCheck()
    with pytest.raises(IntegrityError, match=r"fails its check: .*model\.onnx"):
        check.run(package, LIMITS)
    assert check.last is not None  # it ran in a child, whose usage was measured


def test_a_hostile_tokenizer_model_is_parsed_in_the_child(
    fast_decoder: Path, tmp_path: Path
) -> None:
    """A generate package whose light tokenizer is garbage: sentencepiece refuses it in the
    child, and the refusal is the runtime's PackageError."""
    package = tmp_path / "pkg"
    shutil.copytree(fast_decoder, package)
    (package / "tokenizer.model").write_bytes(b"\x0a\xff\xff\xff\xff\x0f" + bytes(range(256)) * 16)
    manifest = Manifest.read(package)
    files = {**manifest.files, **file_entries(package, ["tokenizer.model"])}
    io = replace(manifest.io, light_tokenizer="tokenizer.model")
    replace(manifest, io=io, files=files).write(package)
    pytest.importorskip("sentencepiece")
    with pytest.raises(PackageError, match="fails its check: cannot read the tokenizer"):
        BoundedCheck().run(package, LIMITS)


def test_a_release_lowers_the_limits_never_raises_them() -> None:
    device = CheckLimits(timeout_s=60, memory_bytes=512 << 20)
    assert device.tightened(5, 1 << 20) == CheckLimits(5, 512 << 20)
    assert device.tightened(600, 128) == CheckLimits(60, 128 << 20)
    assert device.tightened(None, None) == device
    free = CheckLimits(timeout_s=60)  # no device cap: the release's is the cap
    assert free.tightened(None, 256).memory_bytes == 256 << 20


def test_limits_travel_signed_and_only_when_given(tmp_path: Path) -> None:
    key, pub = keypair(tmp_path / "keys", "release")
    package = benign_encoder(tmp_path / "pkg")
    manifest_bytes = (package / MANIFEST_NAME).read_bytes()
    trusted = TrustedKeys.load([pub])
    record = sign_package(package, key, devices=("d",), check_timeout_s=5.0, check_memory_mb=300)
    release, _ = Release.verified(manifest_bytes, record, trusted)
    assert (release.check_timeout_s, release.check_memory_mb) == (5.0, 300)
    plain = sign_package(package, key, devices=("d",))
    assert not {"check_timeout_s", "check_memory_mb"} & set(plain["release"])  # older devices
    assert Release.verified(manifest_bytes, plain, trusted)[0].check_timeout_s is None
    with pytest.raises(ConfigError):
        sign_package(package, key, devices=("d",), check_timeout_s=0)


@pytest.mark.parametrize(
    "limits", [{"check_timeout_s": 0.0}, {"check_timeout_s": -1.0}, {"check_memory_bytes": 1 << 20}]
)
def test_limits_out_of_range_are_refused(tmp_path: Path, limits: dict[str, float]) -> None:
    _, pub = keypair(tmp_path / "keys", "release")
    with pytest.raises(ConfigError, match="check"):
        DeployConfig(folder=tmp_path, trusted=TrustedKeys.load([pub]), **limits)
