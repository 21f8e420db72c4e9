"""The package contract: manifest round trip, schema checks, checksum verification."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgeinfer.errors import IntegrityError, ManifestError
from edgeinfer.manifest import MANIFEST_NAME, Manifest


@pytest.fixture()
def package_copy(minilm_int8: Path, tmp_path: Path) -> Path:
    out = tmp_path / "pkg"
    shutil.copytree(minilm_int8, out)
    return out


def test_manifest_round_trips(minilm_int8: Path, tmp_path: Path) -> None:
    manifest = Manifest.read(minilm_int8)
    manifest.write(tmp_path)
    again = Manifest.read(tmp_path)
    assert again == manifest
    assert again.digest == manifest.digest
    assert json.loads((tmp_path / MANIFEST_NAME).read_text()) == manifest.to_dict()


def test_manifest_describes_the_package(minilm_int8: Path) -> None:
    manifest = Manifest.read(minilm_int8)
    assert manifest.task == "embed"
    assert manifest.precision == "int8"
    assert manifest.quantization["mode"] == "int8-dynamic"
    assert manifest.io["embedding_dim"] == 384
    assert {i["name"] for i in manifest.io["inputs"]} >= {"input_ids", "attention_mask"}
    assert set(manifest.files) == {"model.onnx", "tokenizer.json", "report.json"}
    assert manifest.accuracy["reference"] == "pytorch-fp32"
    assert manifest.accuracy["value"]["passed"] is True
    assert manifest.source["builtin"] is True and len(manifest.source["weights_sha256"]) == 64
    assert {"edgeinfer", "onnxruntime", "onnx", "torch"} <= set(manifest.created_by)
    manifest.verify(minilm_int8)


@pytest.mark.parametrize("name", ["model.onnx", "tokenizer.json", "report.json"])
def test_a_flipped_byte_is_refused(package_copy: Path, name: str) -> None:
    path = package_copy / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=name):
        Manifest.read(package_copy).verify(package_copy)


def test_a_truncated_or_missing_file_is_refused(package_copy: Path) -> None:
    graph = package_copy / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:-10])
    with pytest.raises(IntegrityError, match="bytes"):
        Manifest.read(package_copy).verify(package_copy)
    graph.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        Manifest.read(package_copy).verify(package_copy)


def test_other_schema_versions_and_bad_json_are_refused(package_copy: Path) -> None:
    path = package_copy / MANIFEST_NAME
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "schema_version": 99}))
    with pytest.raises(ManifestError, match="schema_version"):
        Manifest.read(package_copy)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "files"}))
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.read(package_copy)
    path.write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.read(package_copy)
    path.unlink()
    with pytest.raises(ManifestError, match=r"no manifest\.json"):
        Manifest.read(package_copy)
    with pytest.raises(ManifestError, match="does not exist"):
        Manifest.read(package_copy / "nowhere")
