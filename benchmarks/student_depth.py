"""How deep a MiniLM student must be: mean and min cosine to the fp32 teacher on a dev split,
before training and after every epoch, with the export's own distillation code.

    .venv/bin/python benchmarks/student_depth.py --layers 5 [--epochs 3] [--texts 3000]
        [--seq-len 256] [--threads 2]

The three BBC News splits stay apart: the student trains on the built-in training text (even
articles); the dev texts are odd articles i % 11 == 5, which the gate's 200 held texts (odd
articles i % 11 == 0) never include, so a depth chosen here is reported on texts it was not
chosen on. The layer choice, batches (1,024 padded tokens), learning rate and loss are the
export's (``edgeinfer.export.encoder.students.shrink``), so the numbers are those of
``--distill-layers N``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from edgeinfer.export.data.text import article_texts, bbc_articles, builtin_text, training_text
from edgeinfer.export.encoder.students import distill
from edgeinfer.export.encoder.students.shrink import SELECTION_TEXTS, TRAIN
from edgeinfer.export.recipes import find

DEV_TEXTS = 200


def dev_text() -> list[str]:
    """The dev split: both texts of the odd articles i % 11 == 5, DEV_TEXTS at most."""
    odd = bbc_articles()[1::2]
    texts = [t for i, (_, a) in enumerate(odd) if i % 11 == 5 for t in article_texts(a)]
    held = set(builtin_text("held", 200))
    if held & set(texts):
        raise SystemExit("the dev split overlaps the gate's held text")
    return texts[:DEV_TEXTS]


def cosines(student: Any, batches: list[distill.Batch]) -> tuple[float, float]:
    """Mean and min cosine of the student's embedding to the teacher's, text by text."""
    import torch

    values: list[float] = []
    with torch.inference_mode():
        for batch in batches:
            assert batch.targets is not None
            embedding = distill.outputs(student, batch, "embed")[1]
            values.extend((embedding * batch.targets[1]).sum(-1).tolist())
    return sum(values) / len(values), min(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, required=True, help="student depth")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--texts", type=int, default=3000, help="training texts")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    recipe = find("minilm")
    assert recipe is not None
    source = recipe.locate()
    teacher = distill.load_teacher(source, "embed")
    tokenizer = AutoTokenizer.from_pretrained(str(source))  # type: ignore[no-untyped-call]
    texts = training_text(args.texts)

    def batches(items: list[str]) -> list[distill.Batch]:
        return distill.make_batches(
            tokenizer, items, seq_len=args.seq_len, batch_tokens=TRAIN.batch_tokens
        )

    selection = batches(texts[:: max(1, len(texts) // SELECTION_TEXTS)])
    dev = batches(dev_text())
    distill.teacher_targets(teacher, selection, "embed")
    distill.teacher_targets(teacher, dev, "embed")
    began = time.perf_counter()
    keep = distill.select_layers(teacher, selection, "embed", args.layers)
    student = distill.keep_layers(teacher, keep)
    train = batches(texts)
    distill.teacher_targets(teacher, train, "embed", keep)
    mean, low = cosines(student, dev)
    print(f"keeps teacher layers {keep}; untrained: dev cosine mean {mean:.4f} min {low:.4f}")

    def on_epoch(epoch: int, loss: float) -> None:
        mean, low = cosines(student, dev)
        print(
            f"epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}, dev cosine mean {mean:.4f} "
            f"min {low:.4f} ({time.perf_counter() - began:.0f} s)",
            flush=True,
        )

    distill.train(student, train, "embed", replace(TRAIN, epochs=args.epochs), on_epoch=on_epoch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
