"""The builders, registered by name: a recipe names its builder; a user's folder gets the
builder its files call for. Adding a model of a known kind is a recipe, not code here."""

from __future__ import annotations

from edgeinfer.errors import ConfigError
from edgeinfer.export.builder import Builder
from edgeinfer.export.decoder.builder import DecoderBuilder
from edgeinfer.export.early_exit.cnn import ExitCnnBuilder
from edgeinfer.export.early_exit.text import ExitHeadsBuilder
from edgeinfer.export.encoder.builder import EncoderBuilder
from edgeinfer.export.onnx_file.builder import OnnxFileBuilder, detect_task
from edgeinfer.export.options import EarlyExitOptions, ExportOptions
from edgeinfer.export.passes import convert
from edgeinfer.export.source import Source
from edgeinfer.export.vision.builder import VisionBuilder

__all__ = ["BUILDERS", "Builder", "select"]

BUILDERS: dict[str, type[Builder]] = {
    b.name: b
    for b in (
        EncoderBuilder,
        DecoderBuilder,
        VisionBuilder,
        ExitHeadsBuilder,
        ExitCnnBuilder,
        OnnxFileBuilder,
    )
}
# An early-exit export of a model another builder makes: the builder that adds the exits.
_WITH_EXITS = {"encoder": "exit-heads"}


def select(source: Source, options: ExportOptions) -> tuple[type[Builder], str]:
    """The builder for ``source`` and the task it builds (``ConfigError`` when none fits)."""
    recipe = source.recipe
    if recipe is not None:
        name, task = recipe.builder, recipe.task
    elif source.onnx_file is not None:
        name, task = "onnx-file", _onnx_task(source, options)
    else:
        task = convert.detect_task(source) if options.task == "auto" else options.task
        name = "decoder" if task == "generate" else "encoder"
        if task == "classify" and "ForImageClassification" in _architectures(source):
            name = "vision"
    if options.task != "auto" and options.task != task:
        if name not in ("encoder", "onnx-file") or options.task not in ("embed", "classify"):
            raise ConfigError(
                f"{source.name} is exported by the {name} builder as a {task!r} model, "
                f"not {options.task!r}"
            )
        task = options.task  # an encoder folder serves either task
    if isinstance(options.builder, EarlyExitOptions):
        name = _WITH_EXITS.get(name, name)
        if task != "classify" or name not in ("exit-heads", "exit-cnn"):
            raise ConfigError("--early-exit needs a classifier: pass --task classify")
    if name not in BUILDERS:
        raise ConfigError(f"{source.name} names an unknown builder {name!r}: {', '.join(BUILDERS)}")
    builder = BUILDERS[name]
    if task not in builder.tasks:
        raise ConfigError(f"the {name} builder makes {', '.join(builder.tasks)}, not {task!r}")
    return builder, task


def _architectures(source: Source) -> str:
    return " ".join(source.config.get("architectures") or [])


def _onnx_task(source: Source, options: ExportOptions) -> str:
    """The task of an ONNX source: as asked, else from the graph's inputs and outputs."""
    if options.task != "auto":
        return options.task
    from edgeinfer.export import package

    inputs, outputs = package.read_io(source.path / str(source.onnx_file))
    return detect_task(inputs, outputs)
