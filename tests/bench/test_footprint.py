"""The footprint: installed sizes from real dist-info folders, RSS of a real serving process."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.bench import footprint, installed
from edgeinfer.errors import InferenceError

FORBIDDEN = {"torch", "transformers", "optimum", "onnx", "optimum-onnx"}


def _dist(site: Path, name: str, requires: list[str], files: dict[str, int]) -> None:
    """Install a distribution by hand: its files, METADATA and a RECORD listing them."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    record = []
    for rel, size in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(b"x" * size)
        record.append(f"{rel},,{size}")
    record.append(f"{info.name}/METADATA,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


def test_closure_follows_requested_extras_and_sizes_sum_recorded_files(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _dist(
        site,
        "app",
        [
            "core>=1",
            'engine; extra == "cpu"',
            'plotter; extra == "bench"',
            "absent; os_name == 'x'",
        ],
        {"app/__init__.py": 100},
    )
    _dist(site, "core", ["hub"], {"core/__init__.py": 2_000, "core/lib.so": 30_000})
    _dist(site, "engine", ["core"], {"engine/__init__.py": 50_000})
    _dist(site, "hub", [], {"hub/__init__.py": 7_000})
    _dist(site, "plotter", [], {"plotter/__init__.py": 9_000})
    path = [str(site)]

    assert set(installed.requirement_closure("app", path=path)) == {"app", "core", "hub"}
    with_cpu = installed.requirement_closure("app[cpu]", path=path)
    assert set(with_cpu) == {"app", "core", "hub", "engine"}  # no plotter, no missing "absent"

    sizes = {d.name: d for d in installed.distribution_sizes(with_cpu, path=path)}
    metadata_bytes = (site / "core-1.0.dist-info" / "METADATA").stat().st_size
    assert sizes["core"].bytes == 32_000 + metadata_bytes
    assert sizes["core"].files == 3
    assert next(iter(installed.distribution_sizes(with_cpu, path=path))).name == "engine"
    assert installed.distribution_sizes(["not-installed"], path=path) == []


def test_memory_usage_sees_memory_this_process_touches() -> None:
    # A fresh process: in a long test session a freed heap may hand back pages already resident.
    script = (
        "import json, numpy as np\n"
        "from edgeinfer.bench import footprint\n"
        "before = footprint.memory_usage()\n"
        "block = np.ones(64 * 1024 * 1024, dtype=np.uint8)  # 64 MiB, every page written\n"
        "after = footprint.memory_usage()\n"
        "print(json.dumps([before.rss_bytes, after.rss_bytes, after.peak_rss_bytes]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, after, peak = json.loads(done.stdout)
    assert after - before >= 48 * 1024 * 1024
    assert peak >= after


def test_inspect_footprint_measures_a_serving_process(minilm_int8: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edgeinfer", "inspect", str(minilm_int8), "--footprint", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["footprint"]
    serving = footprint.ServingFootprint.from_dict(found["serving"])
    assert serving.task == "embed" and serving.machine == platform.machine()
    # Loading the model and answering costs memory on top of the imported libraries.
    assert serving.serving.rss_bytes > serving.libraries.rss_bytes > 0
    assert serving.serving.peak_rss_bytes >= serving.serving.rss_bytes
    names = {d.name.lower() for d in serving.distributions}
    assert {"numpy", "onnxruntime", "tokenizers", "edgeinfer"} <= names
    assert not names & FORBIDDEN
    assert serving.installed_bytes == sum(d.bytes for d in serving.distributions) > 0
    # What edgeinfer[cpu] installs here holds the runtime's part and more (hub, CLI).
    assert found["requirement_bytes"] > serving.installed_bytes
    assert not {d["name"] for d in found["not_imported"]} & {d.name for d in serving.distributions}

    table = subprocess.run(
        [sys.executable, "-m", "edgeinfer", "inspect", str(minilm_int8), "--footprint"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert table.returncode == 0, table.stderr
    assert "RSS serving" in table.stderr and "edgeinfer[cpu]" in table.stderr


def test_a_failed_measurement_says_why(tmp_path: Path) -> None:
    with pytest.raises(InferenceError, match="not an edgeinfer package"):
        footprint.measure_serving_in_subprocess(tmp_path)


def test_the_breakdown_of_a_generate_package_adds_up(fast_decoder: Path) -> None:
    found = footprint.measure_serving_in_subprocess(fast_decoder)
    parts = found.breakdown
    held = (
        parts.runtime_and_python,
        parts.tokenizer,
        parts.file_weights,
        parts.anonymous_weights,
        parts.kv_cache,
        parts.other_files,
    )
    assert min(held) >= 0
    # The parts split the serving RSS (shared memory aside, which they do not count).
    assert sum(held) <= found.serving.rss_bytes
    assert parts.runtime_and_python == found.libraries.rss_bytes
    assert parts.tokenizer > 0  # a tokenizer holds its vocabulary
    # The request's keys and values: a whole number of tokens, at least the prompt's.
    assert parts.kv_bytes_per_token > 0
    assert parts.kv_cache % parts.kv_bytes_per_token == 0 and parts.kv_cache > 0


@pytest.mark.slow
def test_file_backed_prepacks_move_from_anonymous_to_file_weights(
    smollm2_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path))  # the prepack cache goes here
    plain = footprint.measure_serving_in_subprocess(smollm2_package).breakdown
    backed = footprint.measure_serving_in_subprocess(
        smollm2_package, file_backed_prepacks=True
    ).breakdown
    assert any((tmp_path / "prepacked").iterdir())
    # ~170 MB of int8 blocks, scales and block sums: counted as mapped weights, not anonymous
    assert plain.anonymous_weights - backed.anonymous_weights > 100 * 2**20
    assert backed.file_weights - plain.file_weights > 100 * 2**20
