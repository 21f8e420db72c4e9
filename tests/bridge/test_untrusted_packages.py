"""A package is untrusted input: a manifest naming a file outside its folder, a symbolic link
in it, a file its manifest does not list (a graph's external weights) are refused by
``Manifest`` (so by ``load``, with or without verification, and ``inspect``; deploy's refusal
is in test_deploy.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import IntegrityError, ManifestError
from edgeinfer.manifest import (
    ENGINE_CACHE_DIR_KEY,
    MANIFEST_NAME,
    Manifest,
    check_member_name,
    file_entries,
)


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


def _link_graph_outside(package: Path) -> None:
    """The listed graph becomes a link to the same bytes outside (every sha256 still right)."""
    outside = package.parent / "real.onnx"
    shutil.move(package / "model.onnx", outside)
    (package / "model.onnx").symlink_to(outside)


def _link_a_folder_outside(package: Path) -> None:
    """An unlisted folder link to outside, next to the listed files."""
    (package.parent / "elsewhere").mkdir()
    (package / "weights").symlink_to(package.parent / "elsewhere", target_is_directory=True)


def _link_inside(package: Path) -> None:
    """A link to a listed file of the package itself (no way out, still not a plain file)."""
    (package / "model.onnx.data").symlink_to(package / "model.onnx")


@pytest.mark.parametrize("make_link", [_link_graph_outside, _link_a_folder_outside, _link_inside])
@pytest.mark.parametrize("verify", [True, False])
def test_a_symlink_in_a_package_is_refused(
    minilm_int8: Path, tmp_path: Path, make_link: Callable[[Path], None], verify: bool
) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    make_link(package)
    with pytest.raises(IntegrityError, match="symbolic link"):
        edgeinfer.load(package, verify=verify)


def test_a_package_reached_through_a_link_loads(minilm_int8: Path, tmp_path: Path) -> None:
    """The folder itself may be a link (``current`` -> a version): only its entries may not."""
    (tmp_path / "current").symlink_to(minilm_int8, target_is_directory=True)
    with edgeinfer.load(tmp_path / "current", verify=False) as model:
        assert model.embed("linked").shape == (1, 384)


def external_weights_package(source: Path, root: Path, *, listed: bool) -> Path:
    """A copy of the raw package ``source`` whose graph keeps W in ``weights.bin`` beside it;
    the manifest lists the new graph and, with ``listed``, the weights file too."""
    import onnx

    package = root / "pkg"
    shutil.copytree(source, package)
    graph = onnx.load(str(package / "model.onnx"))
    onnx.save(
        graph,
        str(package / "model.onnx"),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    manifest = Manifest.read(package)
    names = ["model.onnx", "weights.bin"] if listed else ["model.onnx"]
    replace(manifest, files={**manifest.files, **file_entries(package, names)}).write(package)
    return package


def _ort_output(graph: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    state = np.zeros_like(x)
    return np.asarray(session.run(["out"], {"x": x, "state": state})[0])


def test_an_unlisted_external_data_file_is_refused(raw_package: Path, tmp_path: Path) -> None:
    package = external_weights_package(raw_package, tmp_path, listed=False)
    x = np.ones((1, 4), dtype=np.float32)
    before = _ort_output(package / "model.onnx", x)
    weights = package / "weights.bin"
    w = np.frombuffer(weights.read_bytes(), dtype=np.float32) * -3.0
    weights.write_bytes(w.tobytes())  # the same size: only a hash could tell
    # The graph does read the unlisted file: onnxruntime's answer follows it.
    assert not np.allclose(_ort_output(package / "model.onnx", x), before)
    for verify in (True, False):
        with pytest.raises(IntegrityError, match=r"weights\.bin.*does not list") as caught:
            edgeinfer.load(package, verify=verify)
        assert caught.value.code == "integrity"
    result = subprocess.run(
        [sys.executable, "-m", "edgeinfer", "inspect", str(package)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "(integrity)" in result.stderr and "weights.bin" in result.stderr
    assert "verified" not in result.stdout


def test_listed_external_data_is_loaded_and_verified(raw_package: Path, tmp_path: Path) -> None:
    package = external_weights_package(raw_package, tmp_path, listed=True)
    x = np.ones((1, 4), dtype=np.float32)
    with edgeinfer.load(package) as model:
        served = model.run({"x": x, "state": np.zeros_like(x)})["out"]
    assert np.array_equal(served, _ort_output(package / "model.onnx", x))
    weights = package / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[0] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"weights\.bin does not match its sha256"):
        edgeinfer.load(package)


def test_a_file_the_io_names_must_be_listed(minilm_int8: Path, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    data = json.loads((package / MANIFEST_NAME).read_text())
    del data["files"]["tokenizer.json"]  # still named by io.tokenizer
    (package / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"tokenizer\.json.*do not list"):
        Manifest.read(package)


@pytest.mark.parametrize("folder", [".", "", "../engines"])
def test_an_engine_cache_folder_must_not_cover_the_package(
    minilm_int8: Path, tmp_path: Path, folder: str
) -> None:
    """Unlisted files in the TensorRT engine folder are allowed, so it may be no package path."""
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    data = json.loads((package / MANIFEST_NAME).read_text())
    data["extra"] = {**data["extra"], ENGINE_CACHE_DIR_KEY: folder}
    (package / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="plain relative path"):
        Manifest.read(package)


def test_engines_the_runtime_writes_are_allowed(minilm_int8: Path, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    manifest = Manifest.read(package)
    engines = manifest.engine_cache_dir(package)
    engines.mkdir()
    (engines / "TensorrtExecutionProvider_cache_sm87.engine").write_bytes(b"built here")
    manifest.verify(package)
    data = json.loads((package / MANIFEST_NAME).read_text())
    data["files"]["trt_engines/model.onnx"] = data["files"]["model.onnx"]
    (package / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="engine cache folder"):
        Manifest.read(package)
