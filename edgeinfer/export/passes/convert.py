"""Source model folder -> fp32 ONNX graph (optimum-onnx's exporters) and a package tokenizer."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError, ConversionError
from edgeinfer.export.source import Source

__all__ = ["OPTIMUM_TASKS", "detect_task", "prepare_tokenizer", "to_onnx"]

log = logging.getLogger(__name__)

OPTIMUM_TASKS = {"embed": "feature-extraction", "classify": "text-classification"}
# Opset 18: optimum's recommended minimum for BERT-class encoders; onnxruntime runs it from
# 1.14 on, which every supported Jetson/Raspberry Pi image ships or exceeds.
OPSET = 18


def detect_task(source: Source) -> str:
    """Infer the task from the source's architectures: a classification head (text or
    image) -> classify, a causal LM -> generate, else embed."""
    architectures = " ".join(source.config.get("architectures") or [])
    if "ForSequenceClassification" in architectures or "ForImageClassification" in architectures:
        return "classify"
    if "ForCausalLM" in architectures:
        return "generate"
    return "embed"


def to_onnx(source: Source, task: str, out_dir: Path) -> Path:
    """Export ``source`` for ``task`` to ``out_dir/model.onnx`` (fp32) and return its path."""
    if task not in OPTIMUM_TASKS:
        raise ConfigError(
            f"export of task {task!r} is not supported yet; supported: {', '.join(OPTIMUM_TASKS)}"
        )
    from optimum.exporters.onnx import main_export

    out_dir.mkdir(parents=True, exist_ok=True)
    noise = io.StringIO()
    try:
        # optimum prints tracer warnings to stdout/stderr; keep them out of the CLI's output.
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            main_export(
                str(source.path),
                output=out_dir,
                task=OPTIMUM_TASKS[task],
                opset=OPSET,
                do_validation=False,
                no_post_process=True,
                library_name="transformers",
            )
    except Exception as exc:  # optimum/torch raise many unrelated types
        raise ConversionError(
            f"could not convert {source.name} to ONNX for task {task!r}: {exc}"
        ) from exc
    log.debug("optimum export output: %s", noise.getvalue())
    graph = out_dir / "model.onnx"
    if not graph.is_file():
        raise ConversionError(f"the exporter wrote no model.onnx for {source.name}")
    return graph


def _backend_tokenizer(source: Source) -> Any:
    """The source's fast tokenizer as transformers configures it: tokenizer_config.json's
    settings (``add_prefix_space``, ``do_lower_case``, ``strip_accents``, ...) are applied to
    the tokenizer.json pipeline by the tokenizer class, so the device tokenizes as
    transformers does. A folder transformers cannot read keeps its tokenizer.json as it is."""
    from tokenizers import Tokenizer

    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(source.path))  # type: ignore[no-untyped-call]
        backend = getattr(auto, "backend_tokenizer", None)
        if backend is not None:
            return Tokenizer.from_str(backend.to_str())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("transformers cannot read the tokenizer of %s (%s)", source.name, exc)
    return Tokenizer.from_file(str(source.path / "tokenizer.json"))


def prepare_tokenizer(source: Source, out_path: Path) -> dict[str, Any]:
    """Write the source's tokenizer (``_backend_tokenizer``) without padding or truncation (the
    runtime pads each batch to its longest text; MiniLM's file pads everything to 128) and
    return its special ids."""
    tok = _backend_tokenizer(source)
    pad_id = (tok.padding or {}).get("pad_id")
    if pad_id is None:
        pad_id = source.config.get("pad_token_id") or 0
    tok.no_padding()
    tok.no_truncation()
    tok.save(str(out_path))

    def special(*names: str) -> int | None:
        for name in names:
            token_id = tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return None

    return {
        "pad": int(pad_id),
        "bos": special("[CLS]", "<s>", "<|endoftext|>"),
        "eos": special("[SEP]", "</s>", "<|endoftext|>"),
    }
