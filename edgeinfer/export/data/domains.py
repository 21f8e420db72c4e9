"""English text of more than one domain for students (``--distill-layers``): what they train
on by default, and a whole domain held out of that training to gate them on text they never
saw.

- ``news``: the BBC News articles of ``text.py`` (their calibration side trains, their held
  side is the default eval text).
- ``dialogue``: the English conversations of the PyPI package ``chatterbot-corpus``
  (BSD-3-Clause): short questions and answers on everyday topics, each a pair of turns and a
  whole conversation. Its computing topics (``coding``, ``computers``, ``tech_support``) are
  left out: they belong to the held-out domain.
- ``technical`` (held out, never trained on): prose paragraphs of the docstrings of Python's
  own standard library (PSF licence; every machine with Python has them). Paragraph i goes to
  the gate's choice split when i is even, to the report split when it is odd: the gate decides
  on one, the report also shows the other, which nothing was chosen on.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from edgeinfer.errors import ConfigError, MissingDependencyError
from edgeinfer.export.data.text import training_text

__all__ = [
    "HELD_OUT",
    "TRAIN_DOMAINS",
    "broad_training_text",
    "dialogue_texts",
    "technical_text",
]

# The domains the default training text mixes, and the one held out for the off-domain gate.
TRAIN_DOMAINS = ("news", "dialogue")
HELD_OUT = "technical"
# Standard-library modules whose docstrings are the technical text: widely used ones with
# long prose docstrings, importable on every platform (a fixed list: a stable order).
_MODULES = (
    "argparse", "asyncio.events", "asyncio.streams", "base64", "bisect", "calendar",
    "collections", "concurrent.futures", "configparser", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "ftplib",
    "functools", "gettext", "gzip", "hashlib", "heapq", "hmac", "html.parser", "http.client",
    "http.cookiejar", "http.server", "imaplib", "inspect", "ipaddress", "json", "locale",
    "logging", "logging.handlers", "mailbox", "multiprocessing.pool", "numbers", "optparse",
    "os", "pathlib", "pickle", "pkgutil", "platform", "pprint", "queue", "random", "re",
    "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socket", "socketserver",
    "sqlite3", "ssl", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "traceback", "unittest.case", "unittest.mock",
    "urllib.parse", "urllib.request", "uuid", "warnings", "weakref", "xml.dom.minidom",
    "xml.etree.ElementTree", "zipfile",
)  # fmt: skip
# A paragraph counts as prose with at least this many words, most of its characters letters.
_MIN_WORDS = 12
_MIN_LETTER_SHARE = 0.75
_CODE = re.compile(r">>>|\.\.\. |::$|^\s*[-=~]{3,}|\{|\}|\w+\(.*\)\s*->")
# Chatterbot categories about computing: technical, so kept out of the training text.
_TECHNICAL_TOPICS = ("coding", "computers", "tech_support")

HeldSplit = Literal["choice", "report"]


def _docstrings() -> Iterator[str]:
    """Docstrings of each module of ``_MODULES`` and of its own public classes, functions and
    methods, in a stable order."""
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a module a platform lacks (ssl without OpenSSL): skipped
            continue
        yield inspect.getdoc(module) or ""
        for member_name, member in sorted(vars(module).items()):
            if member_name.startswith("_") or getattr(member, "__module__", None) != name:
                continue
            yield inspect.getdoc(member) or ""
            if inspect.isclass(member):
                for _, method in sorted(vars(member).items()):
                    if inspect.isfunction(method) and not method.__name__.startswith("_"):
                        yield inspect.getdoc(method) or ""


def _prose(paragraph: str) -> str | None:
    """The paragraph on one line, or None when it is code, a table or too short."""
    if _CODE.search(paragraph):
        return None
    text = " ".join(paragraph.split())
    letters = sum(c.isalpha() or c.isspace() for c in text)
    if len(text.split()) < _MIN_WORDS or letters < _MIN_LETTER_SHARE * len(text):
        return None
    return text


def technical_text(split: HeldSplit, count: int) -> list[str]:
    """``count`` prose paragraphs of the standard library's docstrings for ``split``."""
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    paragraphs: list[str] = []
    for doc in _docstrings():
        for paragraph in re.split(r"\n\s*\n", doc):
            text = _prose(paragraph)
            if text is not None:
                paragraphs.append(text)
    unique = list(dict.fromkeys(paragraphs))  # inherited and aliased docstrings repeat
    pool = unique[0::2] if split == "choice" else unique[1::2]
    step = max(1, len(pool) // count)  # evenly through the modules, not the first few only
    return pool[::step][:count]


def _dialogue_root() -> Path:
    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("chatterbot-corpus", "export")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "english"


def dialogue_texts() -> list[str]:
    """Every English conversation outside the computing topics as texts: each pair of
    consecutive turns, then each whole conversation (a longer input)."""
    import yaml

    pairs: list[str] = []
    whole: list[str] = []
    for path in sorted(_dialogue_root().glob("*.yml")):
        if path.stem in _TECHNICAL_TOPICS:
            continue
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for conversation in data.get("conversations") or []:
            turns = [" ".join(str(turn).split()) for turn in conversation]
            # one file spells a phrase a character per turn: not dialogue
            turns = [turn for turn in turns if len(turn) > 1]
            if not turns:
                continue
            pairs.extend(" ".join(turns[i : i + 2]) for i in range(max(1, len(turns) - 1)))
            if len(turns) > 2:
                whole.append(" ".join(turns))
    return list(dict.fromkeys(pairs + whole))


def broad_training_text(count: int) -> list[str]:
    """``count`` texts of the ``TRAIN_DOMAINS`` taken in turn (news, dialogue, news, ...)
    until one runs out, then the other: the default distillation text. Nothing of the
    held-out domain, nor of the news gate's held articles."""
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    sources = [training_text(count), dialogue_texts()]
    out: list[str] = []
    for i in range(max(map(len, sources))):
        out.extend(texts[i] for texts in sources if i < len(texts))
    return list(dict.fromkeys(out))[:count]
