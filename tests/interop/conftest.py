"""Interop fixtures: the shared broker, ``edgeinfer serve`` of every kind on it, the packages
named as docs/mqtt.md names them (interop_harness.py has the processes and the clients)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from interop_harness import Served, require_shell_clients, start_serve
from mosquitto import Mosquitto, running_mosquitto


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A plain mosquitto for the interop tests (ids are unique across them)."""
    with running_mosquitto(tmp_path_factory.mktemp("mosquitto")) as server:
        yield server


@pytest.fixture(scope="session")
def smollm2(tiny_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random decoder in a folder named as the docs' generate model (``smollm2``)."""
    folder = tmp_path_factory.mktemp("named") / "smollm2"
    shutil.copytree(tiny_package, folder)
    return folder


@pytest.fixture(scope="session")
def served_packages(
    minilm_int8: Path, minilm_classifier: Path, effnet_fp32: Path, smollm2: Path
) -> list[Path]:
    """Every kind the interop tests send: embed (``minilm-int8``), classify
    (``minilm-classify``), image (``effnet-fp32``), generate (``smollm2``)."""
    return [minilm_int8, minilm_classifier, effnet_fp32, smollm2]


@pytest.fixture(scope="session")
def served(
    broker: Mosquitto, served_packages: list[Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """``edgeinfer serve`` of every kind on the shared broker, device ``plc7``."""
    require_shell_clients()  # waiting for it to come online reads its status with mosquitto_sub
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = start_serve(broker, served_packages, log, "--metrics-interval-s", "1")
    yield server
    assert server.stop() == 0, log.read_text()[-3000:]
