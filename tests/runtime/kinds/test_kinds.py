"""One class per package kind: ``load()`` returns the class of the manifest's ``io.kind``, each
kind has only its own calls (another kind's call says which class has it, and is an
``AttributeError`` for duck-typed callers), a kind's own ``load`` refuses another kind, and
``isinstance`` narrows for mypy."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.package_io import IO_KINDS

ROOT = Path(__file__).resolve().parents[3]

# What load() returns for each io.kind (docs/architecture.md); a detector package's is checked
# where tests/export/test_detect.py exports one, a segmenter's in tests/export/test_segment.py.
CLASS_OF = {
    "text-encoder": edgeinfer.EmbedModel,
    "text-classifier": edgeinfer.ClassifyModel,
    "image-classifier": edgeinfer.ClassifyModel,
    "exit-segments": edgeinfer.ClassifyModel,
    "image-detector": edgeinfer.DetectModel,
    "image-segmenter": edgeinfer.SegmentModel,
    "decoder": edgeinfer.GenerateModel,
    "raw": edgeinfer.RawModel,
}
KINDS = sorted(set(CLASS_OF.values()), key=lambda k: k.__name__)


def test_every_io_kind_is_served_by_exactly_one_class() -> None:
    assert set(CLASS_OF) == set(IO_KINDS)
    for io_kind, kind in CLASS_OF.items():
        assert [k for k in KINDS if io_kind in k.IO_KINDS] == [kind], io_kind
    assert all(issubclass(k, edgeinfer.Model) and k is not edgeinfer.Model for k in KINDS)


def test_load_returns_the_class_of_the_kind(fast_encoder: Path, fast_raw: Path) -> None:
    with edgeinfer.load(fast_encoder, threads=1) as embedder:
        assert type(embedder) is edgeinfer.EmbedModel and embedder.task == "embed"
        assert embedder.cold_start_ms > 0 and set(embedder.load_breakdown_ms) == {
            "verify",
            "session",
            "warmup",
        }
        assert repr(embedder).startswith("EmbedModel('tiny-encoder'")
    with edgeinfer.load(fast_raw, threads=1) as raw:
        assert type(raw) is edgeinfer.RawModel and raw.task == "raw"


@pytest.mark.slow  # its packages come by name (getfixturevalue): exports
@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("minilm_int8", edgeinfer.EmbedModel),
        ("minilm_classifier", edgeinfer.ClassifyModel),
        ("early_exit_package", edgeinfer.ClassifyModel),
        ("mnist_early_exit_package", edgeinfer.ClassifyModel),
        ("effnet_fp32", edgeinfer.ClassifyModel),
        ("tiny_package", edgeinfer.GenerateModel),
        ("raw_package", edgeinfer.RawModel),
    ],
)
def test_load_returns_the_class_of_each_exported_kind(
    fixture: str, kind: type[edgeinfer.Model], request: pytest.FixtureRequest
) -> None:
    package = request.getfixturevalue(fixture)  # exports: slow
    with edgeinfer.load(package, threads=1) as model:
        assert type(model) is kind
    with kind.load(package, threads=1) as narrowed:
        assert type(narrowed) is kind


def test_another_kinds_call_names_the_class_that_has_it(fast_encoder: Path) -> None:
    with edgeinfer.load(fast_encoder, threads=1) as model:
        with pytest.raises(edgeinfer.UnsupportedCallError, match=r"no classify\(\): Classify"):
            model.classify("a text")  # type: ignore[attr-defined]
        with pytest.raises(edgeinfer.ConfigError, match="GenerateModel"):
            model.generate("hello")  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match="RawModel"):
            model.end_stream("mic")  # type: ignore[attr-defined]
        # the bridge's duck typing: another kind's member is absent, like any missing one
        assert not hasattr(model, "generate") and not hasattr(model, "run")
        assert getattr(model, "max_sequences", 1) == 1
        assert getattr(model, "generation_stats", None) is None
        with pytest.raises(AttributeError) as missing:
            model.no_such_member  # type: ignore[attr-defined]  # noqa: B018
        assert not isinstance(missing.value, edgeinfer.ConfigError)


def test_a_call_two_kinds_have_names_both(fast_raw: Path) -> None:
    with edgeinfer.load(fast_raw, threads=1) as model:
        with pytest.raises(edgeinfer.UnsupportedCallError) as caught:
            model.clear_cache()  # type: ignore[attr-defined]
        assert "EmbedModel" in str(caught.value) and "ClassifyModel" in str(caught.value)


def test_a_kinds_load_refuses_another_kind_naming_its_class(
    fast_encoder: Path, fast_raw: Path
) -> None:
    with pytest.raises(edgeinfer.PackageError, match=r"RawModel\.load"):
        edgeinfer.EmbedModel.load(fast_raw)
    with pytest.raises(edgeinfer.PackageError, match=r"EmbedModel\.load"):
        edgeinfer.GenerateModel.load(fast_encoder)
    with pytest.raises(edgeinfer.PackageError, match=r"EmbedModel\.load"):
        edgeinfer.ClassifyModel.load(fast_encoder)


def test_a_load_feature_another_kind_takes_is_refused(fast_raw: Path) -> None:
    with pytest.raises(edgeinfer.ConfigError, match="cache serves embed and classify packages"):
        edgeinfer.load(fast_raw, cache=edgeinfer.CacheConfig(persist=False))
    with pytest.raises(edgeinfer.ConfigError, match="continuous_batching serves generate"):
        edgeinfer.load(fast_raw, continuous_batching=edgeinfer.ContinuousBatchConfig())


def test_kinds_on_torch_free_packages(fast_encoder: Path, fast_raw: Path) -> None:
    embedder = edgeinfer.EmbedModel.load(fast_encoder, threads=1)
    vectors = embedder.embed(["pump pressure rising", "valve closed"])
    assert vectors.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    info = embedder.embed_with_info(["valve closed"])
    np.testing.assert_array_equal(info[0].vector, vectors[1])
    acc = edgeinfer.RawModel.load(fast_raw, threads=1)
    out = acc.run({"x": np.ones((1, 4), np.float32)})["out"]
    np.testing.assert_array_equal(out, np.full((1, 4), 2.0, np.float32))


def test_a_generate_model_streams_what_it_generates(tiny_package: Path) -> None:
    llm = edgeinfer.GenerateModel.load(tiny_package, threads=1)
    whole = llm.generate("hello", max_new_tokens=8)
    assert "".join(c.text for c in llm.stream("hello", max_new_tokens=8)) == whole.text
    assert llm.max_sequences == 1 and llm.generation_stats() is None
    assert not hasattr(llm, "embed")
    batched = edgeinfer.load(
        tiny_package,
        threads=1,
        continuous_batching=edgeinfer.ContinuousBatchConfig(max_sequences=2),
    )
    with batched:
        assert isinstance(batched, edgeinfer.GenerateModel) and batched.max_sequences == 2
        assert batched.generate("hello", max_new_tokens=8).text == whole.text
        stats = batched.generation_stats()
        assert stats is not None and stats["max_sequences"] == 2


def test_a_raw_model_keeps_stream_state(raw_package: Path) -> None:
    acc = edgeinfer.RawModel.load(raw_package, threads=1)
    x = np.ones((1, 4), np.float32)
    first = acc.run({"x": x}, stream="mic")["out"]
    second = acc.run({"x": x}, stream="mic")["out"]
    np.testing.assert_allclose(second, first * 2)  # out = state + 2x: the state carried over
    acc.end_stream("mic")
    np.testing.assert_allclose(acc.run({"x": x}, stream="mic")["out"], first)


def test_configs_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        edgeinfer.SamplingConfig(0.7)  # type: ignore[misc]
    assert edgeinfer.SamplingConfig(temperature=0.7).temperature == 0.7


@pytest.mark.slow  # one mypy run over edgeinfer
def test_isinstance_narrows_for_mypy(tmp_path: Path) -> None:
    snippet = tmp_path / "narrowing.py"
    snippet.write_text(
        textwrap.dedent(
            """\
            import edgeinfer

            model = edgeinfer.load("pkg")
            if isinstance(model, edgeinfer.EmbedModel):
                vectors = model.embed(["a text"])
            model.embed(["a text"])
            embedder = edgeinfer.EmbedModel.load("pkg")
            embedder.embed(["a text"])
            embedder.generate("hello")
            if isinstance(model, edgeinfer.GenerateModel):
                text: str = model.generate("hello").text
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), str(snippet)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [e.split(":")[1] for e in errors] == ["6", "9"], done.stdout
    assert '"Model" has no attribute "embed"' in errors[0]
    assert '"EmbedModel" has no attribute "generate"' in errors[1]
