"""A package is untrusted input: a manifest naming a file outside its folder is refused by
``Manifest`` (so by ``load`` and ``inspect``; deploy's refusal is in test_deploy.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.errors import IntegrityError
from edgeinfer.manifest import MANIFEST_NAME, Manifest, check_member_name


def escaping_package(source: Path, root: Path) -> Path:
    """A copy of ``source`` whose manifest runs ``../outside.onnx`` (a real graph, outside)."""
    package = root / "pkg"
    shutil.copytree(source, package)
    shutil.move(package / "model.onnx", root / "outside.onnx")
    data = json.loads((package / MANIFEST_NAME).read_text())
    data["files"]["../outside.onnx"] = data["files"].pop("model.onnx")
    data["io"]["graph"] = "../outside.onnx"
    (package / MANIFEST_NAME).write_text(json.dumps(data))
    return package


@pytest.mark.parametrize(
    "name", ["../x.onnx", "/etc/passwd", "a/../../x", "C:evil.onnx", "a\\..\\x", "", "a//b", "."]
)
def test_names_that_leave_the_package_are_refused(name: str) -> None:
    with pytest.raises(IntegrityError, match="plain relative path"):
        check_member_name(name)
    assert check_member_name("segments/exit_0.onnx") == "segments/exit_0.onnx"


def test_load_refuses_a_graph_outside_the_package(minilm_int8: Path, tmp_path: Path) -> None:
    package = escaping_package(minilm_int8, tmp_path)
    with pytest.raises(IntegrityError, match=r"outside\.onnx"):
        edgeinfer.load(package)
    with pytest.raises(IntegrityError):  # not even without verification
        edgeinfer.load(package, verify=False)


def test_inspect_refuses_it_with_exit_2(minilm_int8: Path, tmp_path: Path) -> None:
    package = escaping_package(minilm_int8, tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "edgeinfer", "inspect", str(package)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "(integrity)" in result.stderr, result.stderr


def test_a_symlink_leaving_the_package_is_refused(minilm_int8: Path, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    shutil.move(package / "model.onnx", tmp_path / "real.onnx")
    (package / "model.onnx").symlink_to(tmp_path / "real.onnx")
    with pytest.raises(IntegrityError, match="resolves outside"):
        Manifest.read(package).verify(package)
