"""EfficientNet-Lite0 packages, exported once per session through the real pipeline (or reused
from EDGEINFER_TEST_CACHE, re-verified against their manifest). Calibration uses the 128
built-in calibration views (32 kept one decided gate view in 20 from agreeing) and the gate 48
views, so each export takes about half a minute."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.export import images

# Gate views per export: the 4 whole photos and mirrors plus 44 crops, ~25 of them decided.
GATE_VIEWS = 48


@pytest.fixture(scope="session")
def calibration_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 128 built-in calibration views as a .npy file (the ``--calibration FILE`` form)."""
    path = tmp_path_factory.mktemp("calibration") / "views.npy"
    np.save(path, images.builtin_images("calibration", 128, size=224))
    return path


@pytest.fixture(scope="session")
def few_gate_views_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 built-in gate views as a .npy file (``--eval-data``): a quick gate for slow variants."""
    path = tmp_path_factory.mktemp("gate") / "views.npy"
    np.save(path, images.builtin_images("gate", 8, size=224))
    return path


@pytest.fixture(scope="session")
def effnet_fp32(package_root: Path, export_once: Callable[..., Path]) -> Path:
    """The fp32 EfficientNet-Lite0 package (cpu-avx2)."""
    return export_once(
        package_root / "effnet-fp32",
        source="efficientnet-lite0",
        quantize="none",
        held_count=GATE_VIEWS,
    )


@pytest.fixture(scope="session")
def effnet_int8(
    package_root: Path, export_once: Callable[..., Path], calibration_npy: Path
) -> Path:
    """The static QDQ int8 package (cpu-avx2). force_quantize: fixtures must not depend on
    timing on a shared machine; the speed guard is tested on the dynamic variant."""
    return export_once(
        package_root / "effnet-int8-static",
        source="efficientnet-lite0",
        quantize="int8-static",
        calibration=calibration_npy,
        held_count=GATE_VIEWS,
        force_quantize=True,
    )


@pytest.fixture(scope="session")
def effnet_qnn(package_root: Path, export_once: Callable[..., Path]) -> Path:
    """The ``npu-qnn`` package: QNN's QDQ rules, fixed batch 1, built-in calibration."""
    return export_once(
        package_root / "effnet-npu-qnn",
        source="efficientnet-lite0",
        target="npu-qnn",
        quantize="int8-static",
        held_count=GATE_VIEWS,
    )
