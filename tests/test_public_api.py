"""The public API: sorted __all__, docstrings everywhere, keyword-only options."""

from __future__ import annotations

import inspect

import edgeinfer
from edgeinfer import errors


def test_all_is_sorted_and_resolves() -> None:
    assert list(edgeinfer.__all__) == sorted(edgeinfer.__all__)
    for name in edgeinfer.__all__:
        assert hasattr(edgeinfer, name), name


def test_every_public_symbol_has_a_docstring() -> None:
    for name in edgeinfer.__all__:
        obj = getattr(edgeinfer, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name
            for attr, member in vars(obj).items() if inspect.isclass(obj) else []:
                if inspect.isfunction(member) and not attr.startswith("_"):
                    assert inspect.getdoc(member), f"{name}.{attr}"


def test_load_options_are_keyword_only() -> None:
    params = inspect.signature(edgeinfer.load).parameters
    assert next(p.kind for p in params.values()) is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[1:])


def test_every_error_is_public() -> None:
    assert set(errors.__all__) <= set(edgeinfer.__all__)


def test_every_error_has_a_stable_unique_code() -> None:
    classes = [getattr(errors, n) for n in errors.__all__]
    assert all(issubclass(c, errors.EdgeInferError) for c in classes)
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))


def test_missing_extra_names_the_pip_line() -> None:
    exc = errors.MissingDependencyError("onnxruntime", "cpu")
    assert "pip install 'edgeinfer[cpu]'" in str(exc)
