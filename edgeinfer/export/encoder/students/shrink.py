"""Students of a text encoder inside its export (``ShrinkOptions``): for each requested depth,
a student distilled and/or pruned from the source (the teacher) and trained on unlabeled text,
then converted, checked for parity with itself, fused and quantized like the teacher, and
measured against the teacher's PyTorch fp32 outputs on the held text: the same gate.

The teacher's own variants stay in the export as reference points: every candidate's accuracy
and batch-1 latency form the report's Pareto table (and ``pareto.png``); the fastest student
variant that passes the gate ships.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import ConfigError, ParityError
from edgeinfer.export import calibrate, convert, distill, optimize, pareto, prune, validate
from edgeinfer.export.options import ShrinkOptions
from edgeinfer.export.source import resolve_source

if TYPE_CHECKING:
    from edgeinfer.export.builders.encoder import EncoderBuilder

__all__ = ["add_students", "student_name"]

# Texts the layer choice and the importance ranking look at (a few batches: seconds each).
_SELECTION_TEXTS = 96
# Batches of 1,024 padded tokens (about 8 articles or 30 sentences) at a rate of 3e-4: on a
# few thousand texts, many small steps reach a closer student than fewer large ones
# (MiniLM, 4 layers, 2 epochs: mean cosine 0.946 vs 0.934 with 4,096-token batches).
_TRAIN = distill.TrainConfig(batch_tokens=1024, learning_rate=3e-4)


def student_name(layers: int) -> str:
    """The candidate name prefix of the student with ``layers`` layers."""
    return f"student-{layers}L"


def add_students(builder: EncoderBuilder, options: ShrinkOptions) -> None:
    """Build, train, convert and measure every student ``options`` asks for, then time every
    candidate for the Pareto table."""
    import torch
    from transformers import AutoTokenizer

    run = builder.run
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
        calibrate.read_text_file(options.train_data)
        if options.train_data
        else calibrate.training_text(options.train_count)
    )[: options.train_count]
    seq_len = options.seq_len or run.source.max_seq_len or 128
    with run.stage("teacher"):
        teacher = distill.load_teacher(run.source.path, run.task)
        tokenizer = AutoTokenizer.from_pretrained(str(run.source.path))  # type: ignore[no-untyped-call]
        batches = distill.make_batches(
            tokenizer, texts, seq_len=seq_len, batch_tokens=_TRAIN.batch_tokens
        )
        selection = distill.make_batches(
            tokenizer,
            texts[:: max(1, len(texts) // _SELECTION_TEXTS)],
            seq_len=seq_len,
            batch_tokens=_TRAIN.batch_tokens,
        )
        distill.teacher_targets(teacher, selection, run.task)
    data = {
        "data": str(options.train_data) if options.train_data else "builtin:bbc-news-calibration",
        "texts": len(texts),
        "seq_len": seq_len,
        "epochs": options.epochs,
        "seed": options.seed,
    }
    for depth in sorted(depths, reverse=True):
        name = student_name(depth)
        with run.stage(f"distill-{depth}L"):
            folder, structure = _train(builder, teacher, batches, selection, depth, options)
        with run.stage(f"convert-{depth}L"):
            _candidates(builder, name, folder, {**structure, "teacher": run.source.name, **data})
    with run.stage("pareto"):
        pareto.measure(run, builder.held)


def _train(
    builder: EncoderBuilder,
    teacher: Any,
    batches: list[distill.Batch],
    selection: list[distill.Batch],
    depth: int,
    options: ShrinkOptions,
) -> tuple[Path, dict[str, Any]]:
    """One student: layers chosen, heads and neurons pruned, trained; saved as a folder."""
    run, task = builder.run, builder.run.task
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

    config = replace(_TRAIN, epochs=options.epochs, seed=options.seed)
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


def _candidates(builder: EncoderBuilder, name: str, folder: Path, student: dict[str, Any]) -> None:
    """Convert the student folder, check it reproduces itself, fuse, quantize; each variant
    is measured against the teacher's reference (the builder's gate)."""
    run = builder.run
    source = resolve_source(str(folder))
    raw = convert.to_onnx(source, run.task, folder.parent / "onnx")
    own = validate.torch_reference(source, run.task, builder.held)
    fused = folder.parent / "fused.onnx"
    optimize.optimize(source, raw, fused)
    fp32 = builder._candidate(f"{name}-fp32", fused, "fp32", requested=not builder._quantized)
    fp32.extra = {"student": student}
    with validate.load_candidate(run.stage_candidate(fp32), run.threads) as model:
        parity = validate.compare(run.task, own, validate.run_model(model, builder.held))
    run.note(fp32.name, parity=parity.to_dict(run.max_accuracy_loss))
    if not parity.is_parity():
        raise ParityError(
            f"the fused student graph does not reproduce the trained student ({parity.metric} "
            f"min {parity.min:.6f}); this is an exporter bug, please report it"
        )
    builder._measure(run.add(fp32))
    run.note(fp32.name, student=student)
    if builder._quantized:
        int8 = run.add(builder._int8(fused, fp32, name=f"{name}-int8"))
        int8.extra = {"student": student}
        builder._measure(int8)
