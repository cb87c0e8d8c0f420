"""The words of a query, the simple term score of a text (backends without a full-text index,
and the memory file's items), and a text's signature (the Redis archive's word index). One
compiled expression over whole texts: C speed.

A signature is a Bloom filter of a text's distinct words: SIGNATURE_BITS_PER_WORD bits a word
(rounded up to 64), at most MAX_SIGNATURE_BYTES, three bits set per word. A word it holds is
always found; one it does not is wrongly found about 3% of the time at 8 bits a word (more in
a text with more than 512 distinct words, whose filter fills up): a search scores the texts
its signatures point at, so a false hit costs a read, never a wrong answer.
"""

from __future__ import annotations

import math
import re
import zlib
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


def count_words(text: str) -> int:
    """How many distinct words `text` holds (what a full-text index keeps a posting for)."""
    return len(set(_WORD.findall(text.lower())))


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


SIGNATURE_BITS_PER_WORD = 8
MAX_SIGNATURE_BYTES = 512


def signature(text: str) -> bytes:
    """The Bloom filter of the distinct words of `text` (at least 8 bytes)."""
    words = set(_WORD.findall(text.lower()))
    bits = min(
        MAX_SIGNATURE_BYTES * 8, max(64, -(-len(words) * SIGNATURE_BITS_PER_WORD // 64) * 64)
    )
    digests = list(map(zlib.crc32, map(str.encode, words)))
    # Three bits a word, by double hashing one stable digest (its high half the step).
    marks = {digest % bits for digest in digests}
    marks.update([(digest + ((digest >> 16) | 1)) % bits for digest in digests])
    marks.update([(digest + 2 * ((digest >> 16) | 1)) % bits for digest in digests])
    return sum(1 << mark for mark in marks).to_bytes(bits // 8, "little")


def held(signature: bytes, terms: Sequence[str]) -> int:
    """How many of `terms` the text of `signature` may hold (a term it holds always counts)."""
    bits = len(signature) * 8
    value = int.from_bytes(signature, "little")
    count = 0
    for term in terms:
        digest = zlib.crc32(term.encode())
        step = (digest >> 16) | 1
        if all(value >> ((digest + each * step) % bits) & 1 for each in range(3)):
            count += 1
    return count
