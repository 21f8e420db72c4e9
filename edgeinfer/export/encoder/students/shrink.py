"""Students of a text encoder inside its export (``ShrinkOptions``): for each requested depth,
a student distilled and/or pruned from the source (the teacher) and trained on unlabeled text,
saved as a model folder. The encoder builder then runs the student folder through the same
variant pipeline as the teacher (convert, parity, fuse, int8) and measures every variant
against the teacher's PyTorch fp32 outputs on the held text: the same gate.

The teacher's own variants stay in the export as reference points: every candidate's accuracy
and batch-1 latency form the report's Pareto table (``pareto.py``); the fastest student
variant that passes the gate ships.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError
from edgeinfer.export.context import ExportContext
from edgeinfer.export.data.domains import TRAIN_DOMAINS, broad_training_text
from edgeinfer.export.data.text import read_text_file
from edgeinfer.export.encoder.students import distill, prune
from edgeinfer.export.options import ShrinkOptions

__all__ = ["SELECTION_TEXTS", "TRAIN", "Student", "train_students"]

# Texts the layer choice and the importance ranking look at (a few batches: seconds each).
SELECTION_TEXTS = 96
# Batches of 1,024 padded tokens (about 8 articles or 30 sentences) at a rate of 3e-4: on a
# few thousand texts, many small steps reach a closer student than fewer large ones
# (MiniLM, 4 layers, 2 epochs: mean cosine 0.946 vs 0.934 with 4,096-token batches).
TRAIN = distill.TrainConfig(batch_tokens=1024, learning_rate=3e-4)


@dataclass(frozen=True)
class Student:
    """One trained student: its candidate name prefix (``student-4L``), the model folder it
    was saved to (config, weights, tokenizer: a source like any other) and what it is
    (layers kept, heads and FFN left, parameters, losses, the data it trained on)."""

    name: str
    folder: Path
    layers: int
    structure: dict[str, Any]


def student_name(layers: int) -> str:
    """The candidate name prefix of the student with ``layers`` layers."""
    return f"student-{layers}L"


def train_students(run: ExportContext, options: ShrinkOptions) -> Iterator[Student]:
    """Train every student ``options`` asks for, deepest first, each saved as a model folder
    under the export's work folder; yields each as it is done (the teacher stays loaded)."""
    import torch
    from transformers import AutoTokenizer

    if run.threads is not None:
        torch.set_num_threads(run.threads)
    total = int(run.source.config.get("num_hidden_layers", 0))
    depths = options.layers or (total,)
    if any(
        n > total or (n == total and not (options.prune_heads or options.prune_ffn)) for n in depths
    ):
        raise ConfigError(
            f"{run.source.name} has {total} layers: --distill-layers takes fewer "
            "(or the same with --prune-heads / --prune-ffn)"
        )
    texts = (
        read_text_file(options.train_data)
        if options.train_data
        else broad_training_text(options.train_count)
    )[: options.train_count]
    seq_len = options.seq_len or run.source.max_seq_len or 128
    with run.stage("teacher"):
        teacher = distill.load_teacher(run.source.path, run.task)
        tokenizer = AutoTokenizer.from_pretrained(str(run.source.path))  # type: ignore[no-untyped-call]
        batches = distill.make_batches(
            tokenizer, texts, seq_len=seq_len, batch_tokens=TRAIN.batch_tokens
        )
        selection = distill.make_batches(
            tokenizer,
            texts[:: max(1, len(texts) // SELECTION_TEXTS)],
            seq_len=seq_len,
            batch_tokens=TRAIN.batch_tokens,
        )
        distill.teacher_targets(teacher, selection, run.task)
    data = {
        "data": str(options.train_data)
        if options.train_data
        else f"builtin:{'+'.join(TRAIN_DOMAINS)}",
        "texts": len(texts),
        "seq_len": seq_len,
        "epochs": options.epochs,
        "seed": options.seed,
    }
    for depth in sorted(depths, reverse=True):
        with run.stage(f"distill-{depth}L"):
            folder, structure = _train(run, teacher, batches, selection, depth, options)
        yield Student(
            name=student_name(depth),
            folder=folder,
            layers=depth,
            structure={**structure, "teacher": run.source.name, **data},
        )


def _train(
    run: ExportContext,
    teacher: Any,
    batches: list[distill.Batch],
    selection: list[distill.Batch],
    depth: int,
    options: ShrinkOptions,
) -> tuple[Path, dict[str, Any]]:
    """One student: layers chosen, heads and neurons pruned, trained; saved as a folder."""
    task = run.task
    total = len(distill.encoder_layers(teacher))
    keep = (
        distill.select_layers(teacher, selection, task, depth)
        if depth < total
        else list(range(total))
    )
    student = distill.keep_layers(teacher, keep)
    distill.teacher_targets(teacher, batches, task, keep)  # what each student layer learns
    left = {
        "heads": int(teacher.config.num_attention_heads),
        "ffn": teacher.config.intermediate_size,
    }
    if options.prune_heads or options.prune_ffn:
        scores = prune.importance(student, selection)
        left = prune.prune(
            student, scores, heads_fraction=options.prune_heads, ffn_fraction=options.prune_ffn
        )
    started = time.perf_counter()
    name = student_name(depth)

    def on_epoch(epoch: int, loss: float) -> None:
        if run.progress is not None:
            message = f"{name} epoch {epoch + 1}/{options.epochs} loss {loss:.4f}"
            run.progress(message, time.perf_counter() - started)

    config = replace(TRAIN, epochs=options.epochs, seed=options.seed)
    losses = distill.train(student, batches, task, config, on_epoch=on_epoch)
    folder = distill.save_student(student, run.source.path, run.work / name / "model")
    structure = {
        "layers": depth,
        "teacher_layers": keep,
        "heads": left["heads"],
        "ffn": left["ffn"],
        "parameters": sum(p.numel() for p in student.parameters()),
        "losses": [round(loss, 5) for loss in losses],
    }
    return folder, structure
