"""Prompt-lookup decoding: draft tokens by copying from the text so far, verify them in one pass.

When a model quotes, extracts or summarizes its input, the next tokens often continue an n-gram
that already occurred in the prompt (or in the answer so far). ``PromptLookup`` finds the latest
earlier occurrence of the text's last n-gram (the longest of ``NGRAM_SIZES`` that occurred) and
drafts the tokens that followed it. The generator feeds the current token and the draft in one
forward pass over the KV cache; greedy acceptance keeps the drafted tokens up to the first one
the model would not have chosen and adds the model's own choice there, so the tokens are the
greedy tokens: a step yields between 1 and ``len(draft) + 1`` of them for one pass over the
weights.

A pass is not free per row: on a 2-core AVX2 CPU each drafted row adds ~15 % to a one-token
step (the int8 dot products of every layer, the 49k-row head). So drafts are sized by how much
they are likely to hold: at most as long as the text's match with its earlier occurrence (a
2-token match drafts 2 tokens, a quoted sentence many), grown after a fully accepted draft and
cut to what was accepted after a rejection. An occurrence whose continuation was rejected
outright is forgotten, and after a run of such misses (an open answer that shares only common
phrases with its prompt) drafting pauses for a number of tokens that doubles with each miss.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["NGRAM_SIZES", "PromptLookup", "accept_greedy"]

# Longest first: a 3-token match predicts the continuation better than a 2-token one. Single
# tokens match almost everywhere and predict poorly, so they draft nothing.
NGRAM_SIZES = (3, 2)
_FIRST_LENGTH = 4  # the draft length before any verification was seen
_MATCH_SPAN = 16  # how far back a match is measured (it caps the draft length)
_MAX_PAUSE = 32  # tokens without drafting after many misses in a row


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
        self._source: tuple[int, ...] | None = None  # the n-gram the last draft came from
        self._misses = 0  # drafts in a row rejected outright
        self._pause = 0  # tokens left before the next draft
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
        """Append ``token`` (the latest generated one); the tokens that followed the latest
        earlier occurrence of the text's last n-gram (at most ``room``), or none."""
        self.push(token)
        if self._pause:
            self._pause -= 1
            return []
        ids, end = self._ids, len(self._ids)
        for n in NGRAM_SIZES:
            key = tuple(ids[end - n :]) if end > n else None
            start = self._next.get(key) if key is not None else None
            if start is not None:
                self._source = key
                limit = min(room, self.length, self._match(start, end))
                return ids[start : start + limit] if limit > 0 else []
        return []

    def _match(self, start: int, end: int) -> int:
        """How many tokens before ``start`` equal those before ``end`` (up to the span)."""
        ids, length = self._ids, 0
        while length < _MATCH_SPAN and start - length > 0:
            if ids[start - length - 1] != ids[end - length - 1]:
                break
            length += 1
        return length

    def record(self, drafted: int, chosen: Sequence[int]) -> None:
        """Append the tokens a verification of ``drafted`` tokens yielded but the last (the
        next ``draft`` call appends it) and adapt the drafting to how many were accepted."""
        for token in chosen[:-1]:
            self.push(token)
        accepted = len(chosen) - 1
        self.drafted += drafted
        self.accepted += accepted
        if accepted == drafted:
            self.length = min(self.max_tokens, self.length + 2)
        else:
            self.length = max(1, accepted + 1)
        if accepted:
            self._misses = 0
            return
        if self._source is not None:
            self._next.pop(self._source, None)  # that continuation did not hold here
        self._misses += 1
        self._pause = min(_MAX_PAUSE, 2 ** (self._misses - 1) - 1)


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
