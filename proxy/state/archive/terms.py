"""The words of a query, and the simple term score of a text (backends without a full-text
index, and the memory file's items). One compiled expression over whole texts: C speed."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_WORD = re.compile(r"\w+")
_MAX_TERMS = 32


def query_terms(query: str) -> list[str]:
    """Its distinct lowercase words, in order, at most 32."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
        if len(seen) == _MAX_TERMS:
            break
    return list(seen)


def text_terms(text: str) -> dict[str, int]:
    """Each lowercase word of `text` and how often it occurs."""
    counts: dict[str, int] = {}
    for word in _WORD.findall(text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts


def score_text(text: str, terms: Sequence[str]) -> float:
    """How well `text` matches: each term found counts once plus a little per further
    occurrence, so a text holding every term beats one repeating a single term."""
    if not terms:
        return 0.0
    lowered = text.lower()
    score = 0.0
    for term in terms:
        count = len(re.findall(rf"\b{re.escape(term)}\b", lowered))
        if count:
            score += 1.0 + math.log(count)
    return score
