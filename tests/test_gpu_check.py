"""The GPU path without a GPU: tools/gpu_check.sh's dry run, the CUDA/TensorRT options and the
KV cache's device choice. The GPU run itself is documented in docs/providers.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kv_io import decoder_io

from edgeinfer.errors import ConfigError
from edgeinfer.manifest import ENGINE_CACHE_DIR_KEY, Manifest
from edgeinfer.providers import available, provider_options, with_options
from edgeinfer.runtime.generate.kvcache import KVCache, device_for

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.sh"


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_cpu_only_dry_run(minilm_int8: Path) -> None:
    result = _script("--cpu-only", "--rounds", "2", str(minilm_int8))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert any("no GPU was used" in line for line in lines)
    assert any(line.startswith("minilm-int8") and "min cosine 1.00000 ok" in line for line in lines)
    assert json.loads(lines[-1]) == {
        "cpu_only": True,
        "providers": ["CPUExecutionProvider"],
        "parity_ok": True,
    }


def test_without_cuda_it_refuses_and_installs_nothing(minilm_int8: Path) -> None:
    if "CUDAExecutionProvider" in available():
        pytest.skip("this machine has the CUDA provider")
    result = _script(str(minilm_int8))
    assert result.returncode == 2
    assert "installs nothing" in result.stderr


def test_cuda_and_tensorrt_options() -> None:
    cuda = provider_options("cuda")
    assert cuda["arena_extend_strategy"] == "kSameAsRequested"
    assert cuda["cudnn_conv_algo_search"] == "HEURISTIC"
    trt = provider_options("tensorrt", engine_cache_dir=Path("engines"))
    assert trt["trt_fp16_enable"] == trt["trt_engine_cache_enable"] == "1"
    assert trt["trt_engine_cache_path"] == "engines"
    assert provider_options("cpu") == {}


def test_tensorrt_engine_cache_goes_where_the_manifest_says(
    minilm_int8: Path, tmp_path: Path
) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(minilm_int8, package)
    manifest = Manifest.read(package)
    default = dict(
        with_options(["TensorrtExecutionProvider", "CPUExecutionProvider"], package=package)
    )
    assert default["TensorrtExecutionProvider"]["trt_engine_cache_path"] == str(
        package / "trt_engines"
    )
    data = manifest.to_dict()
    data["extra"] = {**data["extra"], ENGINE_CACHE_DIR_KEY: "engines/orin"}
    Manifest.from_dict(data).write(package)
    options = dict(with_options(["TensorrtExecutionProvider"], package=package))
    assert options["TensorrtExecutionProvider"]["trt_engine_cache_path"] == str(
        package / "engines" / "orin"
    )
    assert (package / "engines" / "orin").is_dir()


def test_kv_cache_device_follows_the_first_provider() -> None:
    assert device_for(["CUDAExecutionProvider", "CPUExecutionProvider"]) == "cuda"
    assert device_for(["TensorrtExecutionProvider", "CUDAExecutionProvider"]) == "cuda"
    assert device_for(["CPUExecutionProvider"]) == "cpu"
    io = decoder_io(layers=1, kv_heads=2, head_dim=4)
    cache = KVCache(io, capacity=8)
    assert cache.device == "cpu"
    assert cache.nbytes == 2 * 2 * 8 * 4 * 4  # keys + values, [1, 2, 8, 4] float32
    with pytest.raises(ConfigError):
        KVCache(io, capacity=8, device="npu")
