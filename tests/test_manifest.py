"""The package contract: manifest round trip, schema checks (schema 1 upgraded), typed io per
kind, checksum verification, and bounds on what a manifest may be (size, nesting, values)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import edgeinfer
from edgeinfer.errors import IntegrityError, ManifestError, PackageError
from edgeinfer.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_DEPTH,
    SCHEMA_VERSION,
    Manifest,
)
from edgeinfer.package_io import DecoderIO, TextEncoderIO


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
    assert manifest.io.embedding_dim == 384
    assert {i.name for i in manifest.io.inputs} >= {"input_ids", "attention_mask"}
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


@pytest.mark.parametrize("opening, closing", [('{"a": ', "}"), ("[", "]")])
def test_a_manifest_nested_100k_levels_is_a_manifest_error(
    tmp_path: Path, opening: str, closing: str
) -> None:
    levels = 100_000
    (tmp_path / MANIFEST_NAME).write_text(opening * levels + "1" + closing * levels)
    with pytest.raises(ManifestError, match=f"deeper than {MAX_MANIFEST_DEPTH} levels"):
        Manifest.read(tmp_path)


def test_nesting_past_the_bound_is_refused_below_pythons_recursion(package_copy: Path) -> None:
    path = package_copy / MANIFEST_NAME
    data = json.loads(path.read_text())
    deep: Any = 1
    for _ in range(MAX_MANIFEST_DEPTH):  # with the manifest object itself: one level too many
        deep = {"a": deep}
    path.write_text(json.dumps({**data, "extra": deep}))
    with pytest.raises(ManifestError, match="deeper than"):
        Manifest.read(package_copy)


def test_a_50_mb_manifest_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / MANIFEST_NAME
    with path.open("wb") as f:
        f.write(b"{not json at all")  # were it parsed, the error would say "not valid JSON"
        f.truncate(50 * 10**6)
    with pytest.raises(ManifestError, match=f"more than {MAX_MANIFEST_BYTES} bytes"):
        Manifest.read(tmp_path)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["files"]["model.onnx"].update(bytes=float("inf")),  # int(inf) overflows
        lambda d: d["files"]["model.onnx"].update(bytes="many"),
        lambda d: d.update(files=[]),
        lambda d: d.update(io="text"),
        lambda d: d.update(unknown_field=1),
    ],
)
def test_malformed_values_are_manifest_errors(
    package_copy: Path, change: Callable[[dict[str, Any]], None]
) -> None:
    path = package_copy / MANIFEST_NAME
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError):
        Manifest.read(package_copy)


def test_a_linked_manifest_is_refused(package_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    shutil.move(package_copy / MANIFEST_NAME, outside)
    (package_copy / MANIFEST_NAME).symlink_to(outside)
    with pytest.raises(IntegrityError, match="symbolic link"):
        Manifest.read(package_copy)


def _as_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A manifest as edgeinfer wrote it before io.kind (schema 1)."""
    io = {k: v for k, v in data["io"].items() if k != "kind"}
    if "graphs" in io:  # exit segments named their first graph only
        io["graph"] = io.pop("graphs")[0]
        io.pop("input")
    for key in ("tokenizer", "max_seq_len", "image_shape", "pixel_range"):
        if io.get(key) is None:
            io.pop(key, None)
    old = {k: v for k, v in data.items() if k != "smoke"}
    return {**old, "schema_version": 1, "io": io}


@pytest.mark.slow  # its packages come by name (getfixturevalue): exports
@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("minilm_int8", "text-encoder"),
        ("minilm_classifier", "text-classifier"),
        ("tiny_package", "decoder"),
        ("early_exit_package", "exit-segments"),
        ("mnist_early_exit_package", "exit-segments"),
    ],
)
def test_packages_written_before_io_kind_still_load(
    fixture: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    package = shutil.copytree(request.getfixturevalue(fixture), tmp_path / "old")
    path = package / MANIFEST_NAME
    path.write_text(json.dumps(_as_schema_1(json.loads(path.read_text()))))
    manifest = Manifest.read(package)
    assert manifest.schema_version == SCHEMA_VERSION and manifest.io.kind == kind
    with edgeinfer.load(package) as model:  # and they run
        assert model.manifest.io == Manifest.read(request.getfixturevalue(fixture)).io


def test_io_is_validated_per_kind(package_copy: Path) -> None:
    path = package_copy / MANIFEST_NAME
    data = json.loads(path.read_text())
    cases = {
        "lacks the field 'embedding_dim'": {
            k: v for k, v in data["io"].items() if k != "embedding_dim"
        },
        "unknown fields": {**data["io"], "embedding_dims": 384},
        "must be int": {**data["io"], "max_seq_len": "256"},
        "not one of": {**data["io"], "pooling": "max"},
        "io.kind 'hologram'": {**data["io"], "kind": "hologram"},
    }
    for message, io in cases.items():
        path.write_text(json.dumps({**data, "io": io}))
        with pytest.raises(ManifestError, match=message):
            Manifest.read(package_copy)


def test_a_kind_is_asked_for_by_type(minilm_int8: Path) -> None:
    manifest = Manifest.read(minilm_int8)
    assert manifest.io_as(TextEncoderIO).embedding_dim == 384
    with pytest.raises(PackageError, match="'text-encoder' package, not 'decoder'"):
        manifest.io_as(DecoderIO)
