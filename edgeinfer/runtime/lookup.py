"""Prompt-lookup decoding: draft tokens by copying from the text so far, verify them in one pass.

When a model quotes, extracts or summarizes its input, the next tokens often continue an n-gram
that already occurred in the prompt (or in the answer so far). ``PromptLookup`` finds the latest
earlier occurrence of the text's last n-gram (the longest of ``NGRAM_SIZES`` that occurred) and
drafts the tokens that followed it. The generator feeds the current token and the draft in one
forward pass over the KV cache; greedy acceptance keeps the drafted tokens up to the first one
the model would not have chosen and adds the model's own choice there, so the tokens are the
greedy tokens: a step yields between 1 and ``len(draft) + 1`` of them for the cost of one pass
over the weights (decoding is memory-bound: the pass reads them once for every row).

The draft length adapts (after a fully accepted draft it grows, after a rejection it shrinks to
what was accepted plus one), so an open prompt whose n-grams rarely repeat pays little: a draft
is made only when an n-gram matched, and a failed one costs one extra row in the pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["NGRAM_SIZES", "PromptLookup", "accept_greedy"]

# Longest first: a 3-token match predicts the continuation better than a 2-token one. Single
# tokens match almost everywhere and predict poorly, so they draft nothing.
NGRAM_SIZES = (3, 2)
_FIRST_LENGTH = 4  # the draft length before any verification was seen


class PromptLookup:
    """The n-gram index of a request's tokens (prompt, then every generated token).

    Args:
        ids: the prompt's token ids.
        max_tokens: the longest draft.
    """

    def __init__(self, ids: Sequence[int], *, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.length = min(_FIRST_LENGTH, max_tokens)
        self.drafted = 0  # tokens drafted over the request
        self.accepted = 0  # of them, accepted
        self._ids: list[int] = []
        # n-gram -> the index of the token that followed its latest occurrence
        self._next: dict[tuple[int, ...], int] = {}
        for token in ids:
            self.push(token)

    def push(self, token: int) -> None:
        """Append ``token`` to the text."""
        ids, end = self._ids, len(self._ids)
        # The n-grams ending at the previous token now know their continuation (index end).
        for n in NGRAM_SIZES:
            if end >= n:
                self._next[tuple(ids[end - n : end])] = end
        ids.append(token)

    def draft(self, token: int, room: int) -> list[int]:
        """Append ``token`` (the latest generated one); up to ``min(room, length)`` tokens that
        followed the latest earlier occurrence of the text's last n-gram, or none."""
        self.push(token)
        ids, limit = self._ids, min(room, self.length)
        if limit < 1:
            return []
        end = len(ids)
        for n in NGRAM_SIZES:
            start = self._next.get(tuple(ids[end - n :])) if end > n else None
            if start is not None:
                return ids[start : start + limit]
        return []

    def record(self, drafted: int, chosen: Sequence[int]) -> None:
        """Append the tokens a verification of ``drafted`` tokens yielded but the last (the
        next ``draft`` call appends it) and adapt the draft length to how many were accepted."""
        for token in chosen[:-1]:
            self.push(token)
        accepted = len(chosen) - 1
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.length = min(self.max_tokens, self.length + 2)
        else:
            self.length = max(1, accepted + 1)


def accept_greedy(best: np.ndarray, draft: Sequence[int]) -> list[int]:
    """The greedy tokens a verification pass yields: the drafted tokens up to the first one
    the model would not have chosen, then the model's choice there.

    ``best``: [len(draft) + 1] the argmax after the current token and after each drafted one.
    """
    out: list[int] = []
    for drafted, chosen in zip(draft, best.tolist(), strict=False):
        out.append(chosen)
        if drafted != chosen:
            return out
    out.append(int(best[len(draft)]))
    return out
