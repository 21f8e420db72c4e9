"""Bridge fixtures: a REAL mosquitto on a free loopback port and a real MiniLM model.

See tests/mosquitto.py for how the broker is configured and started (shared with the examples'
tests) and bridge_harness.py for the bridges and clients.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_harness import (
    MOSQUITTO_PASSWD,
    Harness,
    Mosquitto,
    Secure,
    make_certificates,
    require_mosquitto,
)
from mosquitto import running_mosquitto

import edgeinfer


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A plain (anonymous, no TLS) mosquitto shared by one test module."""
    with running_mosquitto(tmp_path_factory.mktemp("mosquitto")) as server:
        yield server


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A mosquitto for one test (the restart test kills it)."""
    with running_mosquitto(tmp_path / "mosquitto") as server:
        yield server


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A mosquitto that takes only TLS connections with a valid user name and password."""
    require_mosquitto()
    if MOSQUITTO_PASSWD is None:
        pytest.skip("mosquitto_passwd is needed to make the password file")
    workdir = tmp_path_factory.mktemp("mosquitto-secure")
    ca, cert, key = make_certificates(workdir / "pki")
    secure = Secure("edge", "s3cret-" + os.urandom(4).hex(), ca, cert, key)
    server = Mosquitto(workdir, secure=secure).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def real_model(minilm_int8: Path) -> edgeinfer.Model:
    """The real MiniLM int8 package, loaded once (no spinning: several bridges share it)."""
    return edgeinfer.load(minilm_int8, config=edgeinfer.RuntimeConfig(spin_wait=False))


@pytest.fixture
def harness(real_model: edgeinfer.Model) -> Iterator[Harness]:
    h = Harness(real_model)
    yield h
    h.close()


@pytest.fixture(scope="module")
def module_harness(real_model: edgeinfer.Model) -> Iterator[Harness]:
    h = Harness(real_model)
    yield h
    h.close()


@pytest.fixture(scope="session")
def effnet_package(package_root: Path, export_once: Any) -> Path:
    """The fp32 EfficientNet-Lite0 image classifier (the same package as tests/vision's)."""
    return export_once(
        package_root / "effnet-fp32", source="efficientnet-lite0", quantize="none", held_count=48
    )
