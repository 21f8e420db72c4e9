"""Typed handles: each kind's calls only, the same answers as ``Model``, a clear error for a
package of another task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer


def test_an_embed_handle_answers_as_the_model_does(minilm_int8: Path) -> None:
    with edgeinfer.EmbedModel.load(minilm_int8, threads=1) as embedder:
        model = embedder.model
        texts = ["pump 4 vibration high", "valve 2 closed"]
        np.testing.assert_array_equal(embedder.embed(texts), model.embed(texts))
        assert embedder.task == "embed" and embedder.providers == model.providers
        assert not hasattr(embedder, "generate") and not hasattr(embedder, "run")


def test_a_generate_handle_streams_what_it_generates(tiny_package: Path) -> None:
    llm = edgeinfer.GenerateModel.load(tiny_package, threads=1)
    whole = llm.generate("hello", max_new_tokens=8)
    assert "".join(c.text for c in llm.stream("hello", max_new_tokens=8)) == whole.text
    assert not hasattr(llm, "embed")


def test_a_raw_handle_keeps_stream_state(raw_package: Path) -> None:
    acc = edgeinfer.RawModel.load(raw_package, threads=1)
    x = np.ones((1, 4), np.float32)
    first = acc.run({"x": x}, stream="mic")["out"]
    second = acc.run({"x": x}, stream="mic")["out"]
    np.testing.assert_allclose(second, first * 2)  # out = state + 2x: the state carried over
    acc.end_stream("mic")
    np.testing.assert_allclose(acc.run({"x": x}, stream="mic")["out"], first)


@pytest.mark.slow  # its packages come by name (getfixturevalue): exports
@pytest.mark.parametrize(
    ("handle", "fixture"),
    [(edgeinfer.GenerateModel, "minilm_int8"), (edgeinfer.EmbedModel, "tiny_package")],
)
def test_a_package_of_another_task_is_refused_naming_its_handle(
    handle: type, fixture: str, request: pytest.FixtureRequest
) -> None:
    package = request.getfixturevalue(fixture)
    with pytest.raises(edgeinfer.PackageError, match="Model for it"):
        handle.load(package, threads=1)


def test_configs_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        edgeinfer.SamplingConfig(0.7)  # type: ignore[misc]
    assert edgeinfer.SamplingConfig(temperature=0.7).temperature == 0.7


def test_handles_on_torch_free_packages(fast_encoder: Path, fast_raw: Path) -> None:
    embedder = edgeinfer.EmbedModel.load(fast_encoder, threads=1)
    vectors = embedder.embed(["pump pressure rising", "valve closed"])
    assert vectors.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    acc = edgeinfer.RawModel.load(fast_raw, threads=1)
    out = acc.run({"x": np.ones((1, 4), np.float32)})["out"]
    np.testing.assert_array_equal(out, np.full((1, 4), 2.0, np.float32))
    with pytest.raises(edgeinfer.PackageError, match="RawModel"):
        edgeinfer.EmbedModel.load(fast_raw)
