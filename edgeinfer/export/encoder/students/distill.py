"""Knowledge distillation of a text encoder: a smaller student made from the teacher's own
weights, trained on unlabeled text to reproduce the teacher (``--distill-layers N``, and the
recovery training after ``--prune-heads`` / ``--prune-ffn``).

The student starts as a copy of the teacher with a subset of its layers, chosen greedily on
calibration text: the layer whose removal costs the least agreement goes first (for
all-MiniLM-L6-v2 the last layer matters most). Its embeddings stay frozen (they are the
teacher's). Training matches, batch by batch of texts of similar length, the teacher's last
hidden states token by token (a rich signal from a few thousand texts) and the task's output:
the pooled, normalized embedding or the class probabilities. Dropout stays off and every
random choice is seeded: the same text and options give the same student.
"""

from __future__ import annotations

import copy
import math
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError

__all__ = [
    "Batch",
    "TrainConfig",
    "agreement",
    "encoder_layers",
    "keep_layers",
    "load_teacher",
    "make_batches",
    "outputs",
    "save_student",
    "select_layers",
    "teacher_targets",
    "train",
]

# Files of a model folder that describe the weights rather than the tokenizer or pooling.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".gguf", ".h5", ".msgpack", ".ot")
# Classifier logits are matched at temperature 2: the teacher's second choices carry signal.
_TEMPERATURE = 2.0


@dataclass(frozen=True)
class TrainConfig:
    """How a student trains.

    Args:
        epochs: passes over the training text.
        learning_rate: AdamW's peak rate (5 % linear warm-up, then linear decay to 0).
        batch_tokens: padded tokens per batch (texts are grouped by length).
        seed: seeds batch order and every torch random choice.
    """

    epochs: int = 3
    learning_rate: float = 3e-4
    batch_tokens: int = 1024
    seed: int = 0


@dataclass
class Batch:
    """Texts of similar length, tokenized together: ``input_ids`` and ``attention_mask``
    [B, S] int64 tensors; ``targets`` the teacher's outputs on them (``teacher_targets``)."""

    input_ids: Any
    attention_mask: Any
    targets: tuple[Any, Any] | None = None


def load_teacher(path: Path, task: str) -> Any:
    """The teacher in PyTorch fp32, eager attention (pruning hooks see every head)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if task == "classify" else AutoModel
    model = auto.from_pretrained(str(path), attn_implementation="eager")
    return model.eval()


def encoder_layers(model: Any) -> Any:
    """The ``ModuleList`` of transformer layers of a BERT-family encoder."""
    encoder = getattr(model.base_model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is None or not hasattr(layers[0], "attention"):
        raise ConfigError(
            f"distillation and pruning take BERT-family encoders (bert, roberta, xlm-roberta); "
            f"{model.config.model_type} has another layout"
        )
    return layers


def keep_layers(model: Any, keep: Sequence[int]) -> Any:
    """A copy of ``model`` with only the layers ``keep`` (0-based, in order)."""
    import torch

    student = copy.deepcopy(model)
    layers = encoder_layers(student)
    student.base_model.encoder.layer = torch.nn.ModuleList([layers[i] for i in keep])
    student.config.num_hidden_layers = len(keep)
    return student


def make_batches(
    tokenizer: Any, texts: Sequence[str], *, seq_len: int, batch_tokens: int
) -> list[Batch]:
    """Tokenize ``texts`` (cut at ``seq_len`` tokens) into batches of similar length holding
    at most ``batch_tokens`` padded tokens each."""
    import torch

    encoded = tokenizer(list(texts), truncation=True, max_length=seq_len)["input_ids"]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    groups: list[list[int]] = []
    for i in order:
        longest = len(encoded[i])  # sorted: the newest text is the longest of its group
        if groups and (len(groups[-1]) + 1) * longest <= batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    batches = []
    for group in groups:
        width = max(len(encoded[i]) for i in group)
        ids = torch.zeros((len(group), width), dtype=torch.int64)  # [B, S], 0 = [PAD]
        mask = torch.zeros((len(group), width), dtype=torch.int64)
        for row, i in enumerate(group):
            ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
            mask[row, : len(encoded[i])] = 1
        batches.append(Batch(ids, mask))
    return batches


def outputs(model: Any, batch: Batch, task: str) -> tuple[Any, Any]:
    """(every layer's hidden states: a tuple of [B, S, D], the embeddings' first, the task
    output): the pooled, L2-normalized embedding [B, D] for ``embed`` (as the runtime computes
    it) or the logits [B, C] for ``classify``."""
    import torch

    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        token_type_ids=torch.zeros_like(batch.input_ids),
        output_hidden_states=True,
    )
    if task == "classify":
        return out.hidden_states, out.logits
    hidden = out.last_hidden_state  # [B, S, D]
    mask = batch.attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return out.hidden_states, torch.nn.functional.normalize(pooled, dim=-1)


def agreement(student_out: Any, teacher_out: Any, task: str) -> float:
    """How closely task outputs agree: mean cosine (embed) or 1 - mean total variation
    distance of the class probabilities (classify); 1.0 is identical."""
    import torch

    if task == "classify":
        p, q = torch.softmax(student_out, -1), torch.softmax(teacher_out, -1)
        return float(1.0 - 0.5 * (p - q).abs().sum(-1).mean())
    return float((student_out * teacher_out).sum(-1).mean())


def teacher_targets(
    teacher: Any, batches: list[Batch], task: str, layers: Sequence[int] = ()
) -> None:
    """Store the teacher's task output on each batch, and the hidden states after each of the
    0-based ``layers`` (the student's layer i learns to reproduce layer ``layers[i]``), kept
    in float16."""
    import torch

    with torch.no_grad():  # not inference_mode: the student's loss reads these under autograd
        for batch in batches:
            hidden, out = outputs(teacher, batch, task)
            batch.targets = (tuple(hidden[i + 1].to(torch.float16) for i in layers), out.float())


def select_layers(teacher: Any, batches: list[Batch], task: str, count: int) -> list[int]:
    """The ``count`` teacher layers a student keeps: remove, one at a time, the layer whose
    removal keeps the task output closest to the teacher's on ``batches`` (with targets)."""
    import torch

    total = len(encoder_layers(teacher))
    if not 1 <= count < total:
        raise ConfigError(f"--distill-layers must be in [1, {total - 1}] for a {total}-layer model")
    keep = list(range(total))
    with torch.inference_mode():
        while len(keep) > count:
            scores = {}
            for drop in keep:
                trial = keep_layers(teacher, [i for i in keep if i != drop])
                scores[drop] = sum(_agreement_on(trial, b, task) for b in batches)
            keep.remove(max(scores, key=lambda k: scores[k]))
    return keep


def _agreement_on(model: Any, batch: Batch, task: str) -> float:
    assert batch.targets is not None  # filled by teacher_targets first
    return agreement(outputs(model, batch, task)[1], batch.targets[1], task)


def _loss(student: Any, batch: Batch, task: str) -> Any:
    """1 - cosine to the teacher's hidden states token by token after every student layer
    (averaged over layers), plus the task's loss."""
    import torch

    assert batch.targets is not None  # filled by teacher_targets first
    targets, out_t = batch.targets
    hidden, out = outputs(student, batch, task)
    mask = batch.attention_mask.to(out_t.dtype)  # [B, S]
    hidden_loss = 0.0
    for mine, theirs in zip(hidden[1:], targets, strict=True):
        token_cos = torch.nn.functional.cosine_similarity(mine, theirs.float(), dim=-1)  # [B, S]
        hidden_loss = hidden_loss + ((1.0 - token_cos) * mask).sum() / mask.sum()
    hidden_loss = hidden_loss / max(1, len(targets))
    if task == "classify":
        t = _TEMPERATURE
        task_loss = torch.nn.functional.kl_div(
            torch.log_softmax(out / t, -1), torch.softmax(out_t / t, -1), reduction="batchmean"
        ) * (t * t)
    else:
        task_loss = (1.0 - (out * out_t).sum(-1)).mean()
    return hidden_loss + task_loss


def train(
    student: Any,
    batches: list[Batch],
    task: str,
    config: TrainConfig,
    *,
    on_epoch: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``student`` to match the teacher's targets stored on ``batches``; returns the
    mean loss of each epoch (``on_epoch(epoch, loss)`` after each)."""
    import torch

    torch.manual_seed(config.seed)
    for p in student.base_model.embeddings.parameters():
        p.requires_grad_(False)  # shared with the teacher: the student learns its layers only
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.01)
    steps = max(1, config.epochs * len(batches))
    warmup = max(1, steps // 20)

    def rate(step: int) -> float:
        return min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    rng = random.Random(config.seed)
    order = list(range(len(batches)))
    student.eval()  # dropout off: the student matches the teacher's deterministic outputs
    losses = []
    for epoch in range(config.epochs):
        rng.shuffle(order)
        total = 0.0
        for i in order:
            loss = _loss(student, batches[i], task)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            total += float(loss.detach())
        losses.append(total / max(1, len(order)))
        if not math.isfinite(losses[-1]):
            raise ConfigError("distillation diverged (loss is not finite); lower the epochs")
        if on_epoch is not None:
            on_epoch(epoch, losses[-1])
    for p in student.parameters():
        p.requires_grad_(False)
    return losses


def save_student(student: Any, source: Path, folder: Path) -> Path:
    """Write ``student`` as a model folder: its config and weights, and the teacher's
    tokenizer and pooling files (everything at the top of ``source`` that is not weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "config.json" and path.suffix not in _WEIGHT_SUFFIXES:
            shutil.copy2(path, folder / path.name)
    student.save_pretrained(str(folder), safe_serialization=True)
    return folder
