"""A BBC News topic classifier and its distilled student: accuracy on held-out articles and the
student's speed-up.

    .venv/bin/python benchmarks/bbc_student.py --out pkg/bbc-student [--layers 5] [--epochs 4]
        [--teacher-epochs 3] [--threads 2] [--json F]

1. The teacher: all-MiniLM-L6-v2 (the ``minilm`` recipe) with a five-topic head, fine-tuned on
   the train split of BBC News (``labelled_split("train")``: articles i % 10 in 0-5, each as
   headline + first sentence and as the whole article), seeded; written as a Hugging Face
   folder (OUT/teacher). Reused when it is there; so is the student with ``--reuse``.
2. The export: ``edgeinfer export OUT/teacher --task classify --distill-layers N --train-data
   OUT/train.txt``: the student learns the teacher's class probabilities (and hidden states)
   on the train split's texts, without their labels.
3. Accuracy on the test split (articles i % 10 in 8-9, which neither step saw): the teacher in
   PyTorch fp32 and the shipped student through the runtime, both cutting texts at the
   package's window (512 tokens, the model's own); batch-1 latency of both on the same texts,
   taking turns block by block (50 texts); and the export's Pareto table (every candidate's
   agreement with the teacher and latency on the gate's held texts).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import edgeinfer
from edgeinfer.errors import ExportError
from edgeinfer.export.data.topics import LabelledSplit, labelled_split
from edgeinfer.export.options import ExportOptions, ShrinkOptions
from edgeinfer.export.recipes import find
from edgeinfer.export.run import export
from edgeinfer.package_io import TextClassifierIO

SEQ_LEN = 256  # fine-tuning window
BLOCK = 50  # texts each model runs before the other takes its turn
BATCH_TOKENS = 4096
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def fine_tune(folder: Path, *, epochs: int, seed: int) -> None:
    """The teacher: MiniLM with a topic head trained on the labelled train split."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    recipe = find("minilm")
    assert recipe is not None
    source = recipe.locate()
    train = labelled_split("train")
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(
        str(source),
        num_labels=len(train.topics),
        id2label=dict(enumerate(train.topics)),
        label2id={t: i for i, t in enumerate(train.topics)},
    )
    tokenizer = AutoTokenizer.from_pretrained(str(source))  # type: ignore[no-untyped-call]
    encoded = tokenizer(train.texts, truncation=True, max_length=SEQ_LEN)["input_ids"]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    groups: list[list[int]] = [[]]
    for i in order:  # batches of texts of similar length, BATCH_TOKENS padded tokens at most
        if groups[-1] and (len(groups[-1]) + 1) * len(encoded[i]) > BATCH_TOKENS:
            groups.append([])
        groups[-1].append(i)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    steps = epochs * len(groups)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    rng = random.Random(seed)
    model.train()
    for epoch in range(epochs):
        rng.shuffle(groups)
        total = 0.0
        for group in groups:
            width = max(len(encoded[i]) for i in group)
            ids = torch.zeros((len(group), width), dtype=torch.int64)
            mask = torch.zeros_like(ids)
            for row, i in enumerate(group):
                ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
                mask[row, : len(encoded[i])] = 1
            labels = torch.tensor(train.labels[group])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach())
        print(
            f"  teacher epoch {epoch + 1}/{epochs} loss {total / len(groups):.4f}", file=sys.stderr
        )
    model.eval().save_pretrained(str(folder))
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, folder / name)


def torch_classifier(folder: Path, window: int) -> Any:
    """predict(text) -> topic index, with the teacher in PyTorch fp32 (eager, batch 1), texts
    cut at ``window`` tokens."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))  # type: ignore[no-untyped-call]

    def predict(text: str) -> int:
        with torch.inference_mode():
            feeds = tokenizer([text], truncation=True, max_length=window, return_tensors="pt")
            return int(model(**feeds).logits[0].argmax())

    return predict


def evaluate(teacher: Any, student: edgeinfer.Model, split: LabelledSplit) -> dict[str, Any]:
    """Accuracy of both on ``split`` and their batch-1 latency. They take turns block by block:
    text by text, onnxruntime's threads still spinning after the student's call would slow
    the next PyTorch call."""
    n = len(split.texts)
    correct = {"teacher_torch_fp32": np.zeros(n, bool), "student": np.zeros(n, bool)}
    ms = {name: np.zeros(n) for name in correct}
    for start in range(0, n, BLOCK):
        block = range(start, min(n, start + BLOCK))
        for i in block:
            began = time.perf_counter()
            guess = teacher(split.texts[i])
            ms["teacher_torch_fp32"][i] = (time.perf_counter() - began) * 1e3
            correct["teacher_torch_fp32"][i] = guess == split.labels[i]
        for i in block:
            began = time.perf_counter()
            answer = student.classify([split.texts[i]])[0].label
            ms["student"][i] = (time.perf_counter() - began) * 1e3
            correct["student"][i] = answer == split.topics[split.labels[i]]
    accuracy = {name: float(np.mean(v)) for name, v in correct.items()}
    p50 = {name: float(np.median(v)) for name, v in ms.items()}
    short = np.array([v == "short" for v in split.variants])
    by_variant = {
        variant: {name: float(np.median(v[short == is_short])) for name, v in ms.items()}
        for variant, is_short in (("short", True), ("full", False))
    }
    return {
        "texts": len(split.texts),
        "accuracy": accuracy,
        "drop_points": round(100 * (accuracy["teacher_torch_fp32"] - accuracy["student"]), 3),
        "p50_ms": p50,
        "p50_ms_by_variant": by_variant,
        "speedup_p50": round(p50["teacher_torch_fp32"] / p50["student"], 3),
    }


def build_student(args: argparse.Namespace, teacher_dir: Path, package: Path) -> dict[str, Any]:
    """Export the student (or, with ``--reuse``, read the report of the one already there);
    the export report as a dict."""
    if args.reuse and (package / "report.json").is_file():
        report: dict[str, Any] = json.loads((package / "report.json").read_text())
        return report
    train_txt = args.out / "train.txt"  # the train split's texts, unlabeled, one per line
    train_txt.write_text(
        "\n".join(" ".join(t.split()) for t in labelled_split("train").texts) + "\n",
        encoding="utf-8",
    )
    return export(
        ExportOptions(
            source=str(teacher_dir),
            out=package,
            task="classify",
            quantize="int8",
            force_quantize=True,
            max_accuracy_loss=args.max_accuracy_loss,
            overwrite=True,
            threads=args.threads,
            builder=ShrinkOptions(
                layers=(args.layers,), epochs=args.epochs, train_data=train_txt, seed=args.seed
            ),
        ),
        progress=lambda stage, s: print(f"  {stage:<28} {s:7.1f} s", file=sys.stderr),
    ).to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("pkg/bbc-student"))
    parser.add_argument("--layers", type=int, default=5, help="student depth")
    parser.add_argument("--epochs", type=int, default=4, help="student training epochs")
    parser.add_argument("--teacher-epochs", type=int, default=3)
    parser.add_argument("--max-accuracy-loss", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--reuse", action="store_true", help="measure the student already in OUT/student"
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    teacher_dir, package = args.out / "teacher", args.out / "student"
    if not (teacher_dir / "config.json").is_file():
        teacher_dir.mkdir(parents=True, exist_ok=True)
        fine_tune(teacher_dir, epochs=args.teacher_epochs, seed=args.seed)
    try:
        report = build_student(args, teacher_dir, package)
    except ExportError as exc:  # the gate's table still says how close every candidate came
        print(json.dumps({"error": str(exc), "report": exc.report}, indent=2))
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    student = edgeinfer.load(package, threads=args.threads)
    io = student.manifest.io
    assert isinstance(io, TextClassifierIO), io.kind
    window = io.max_seq_len
    test = evaluate(torch_classifier(teacher_dir, window), student, labelled_split("test"))
    result = {
        "student": report["chosen"],
        "window": window,
        "pareto": report["pareto"],
        "test": test,
    }
    print(json.dumps(result, indent=2))
    print(
        f"test split, {test['texts']} texts: teacher (PyTorch fp32) accuracy "
        f"{test['accuracy']['teacher_torch_fp32']:.4f}, student {report['chosen']} "
        f"{test['accuracy']['student']:.4f} (drop {test['drop_points']:.2f} points); "
        f"batch-1 p50 {test['p50_ms']['teacher_torch_fp32']:.2f} ms vs "
        f"{test['p50_ms']['student']:.2f} ms ({test['speedup_p50']:.2f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
