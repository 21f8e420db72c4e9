"""What every builder implements: turn a source into candidates, each with its quality.

A builder converts the source, checks fp32 parity, makes the candidate variants the options
ask for and measures each against its gate (``ExportContext.add`` / ``measured``). The run then
chooses one (the gate, ``prefer`` among those that pass, the speed guard against fp32 with the
builder's ``probe``) and writes the package.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from edgeinfer.errors import ConfigError
from edgeinfer.export import package
from edgeinfer.export.context import Candidate, ExportContext
from edgeinfer.package_io import PackageIO

__all__ = ["Builder", "GraphBuilder"]


class Builder(abc.ABC):
    """One way of exporting a kind of model (registered by ``name`` in ``registry.py``).

    Class attributes:
        name: the registry name recipes use.
        tasks: the tasks it builds.
        cpu_only: whether it builds for ``cpu-*`` targets only.
        options_type: the type of ``ExportOptions.builder`` it takes (None: takes none).
    """

    name: ClassVar[str]
    tasks: ClassVar[tuple[str, ...]]
    cpu_only: ClassVar[bool] = True
    options_type: ClassVar[type[Any] | None] = None

    def __init__(self, run: ExportContext) -> None:
        self.run = run
        given = run.options.builder
        wanted = self.options_type
        if given is not None and (wanted is None or not isinstance(given, wanted)):
            raise ConfigError(
                f"{type(given).__name__} does not apply to {run.source.name}, which the "
                f"{self.name} builder exports"
            )

    @abc.abstractmethod
    def build(self) -> None:
        """Convert, check parity, add the candidates with their measured quality."""

    def prefer(self, passing: list[Candidate]) -> Candidate:
        """Which of the requested candidates that pass the gate to ship (the first)."""
        return passing[0]

    def probe(self, candidate: Candidate) -> Callable[[], object] | None:
        """One unit of work on ``candidate`` for the speed guard (None: no guard)."""
        return None

    def slower_hint(self, candidate: Candidate) -> str:
        """Advice appended when ``candidate`` is refused as slower than fp32."""
        return ""

    @abc.abstractmethod
    def accuracy(self, chosen: Candidate) -> dict[str, Any]:
        """The manifest's ``accuracy`` field for the shipped candidate."""

    @abc.abstractmethod
    def smoke_inputs(self, chosen: Candidate) -> list[Any]:
        """A few held inputs (texts, images or prompts) for the package's smoke check."""


class GraphBuilder(Builder):
    """A builder whose every candidate is one graph (the package's ``model.onnx``) beside the
    same files: the encoder, vision and onnx-file builders. A subclass says what a graph's
    package io is and fills ``side_files`` (package name -> built file, e.g. the tokenizer),
    ``tokens`` and ``extra`` (manifest fields) before it makes candidates."""

    def __init__(self, run: ExportContext) -> None:
        super().__init__(run)
        self.side_files: dict[str, Path] = {}
        self.tokens: dict[str, int | None] = {}
        self.extra: dict[str, Any] = {}

    @abc.abstractmethod
    def graph_io(self, graph: Path) -> PackageIO:
        """The package io of a candidate whose graph is ``graph``."""

    def graph_files(self, name: str, graph: Path) -> dict[str, Path]:
        """The package files of candidate ``name``'s graph (package name -> built file)."""
        return {package.GRAPH_NAME: graph}

    def candidate(
        self,
        name: str,
        graph: Path,
        precision: str,
        *,
        requested: bool = False,
        quantization: dict[str, Any] | None = None,
    ) -> Candidate:
        """Candidate ``name``: ``graph`` as the package's graph, beside ``side_files``."""
        return Candidate(
            name=name,
            precision=precision,
            files={**self.graph_files(name, graph), **self.side_files},
            io=self.graph_io(graph),
            quantization=quantization or {"mode": "none"},
            tokens=dict(self.tokens),
            extra=dict(self.extra),
            requested=requested,
        )
