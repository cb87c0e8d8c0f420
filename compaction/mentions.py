"""What the prose of many folded messages mentions (paths, numbers, identifiers), in one pass.

`scan_prose(texts)` gives, for each text, what `scan.find_paths(strip_fences(text))` and
`scan.mentioned_values(text)` give, but scans the texts joined into one string: each compiled
regular expression runs once over the whole text (a few calls in C instead of a few per message),
and each hit is mapped back to its text by bisecting the texts' offsets.

The joined texts are separated by a newline: every finder reads a newline as the edge of a word
and of a line, which is what the start and end of a text are to it, so no hit spans two texts and
none changes. The per-word filters of scan.py (only words that can hold a path or an identifier
are read) become two scans each, forwards and over the reversed text, whose patterns open with a
character class the regex engine skips to in C: one hit per candidate word gives its end, one hit
per candidate word of the reversed text gives its start.

`MentionCache` keeps each text's result by its content, so a compaction that folds messages an
earlier one already read (a precomputed compaction redone over a longer history) scans only the
new ones.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from compaction.scan import (
    DIGITS_PATTERN,
    IDENTIFIER_PATTERN,
    PATH_PATTERN,
    PATH_TRAILING,
    is_after_word,
    is_path_token,
    number_in_context,
    strip_fences,
)

_SEPARATOR = "\n"
# A word that can hold a path has a slash or a dot before its last character; one that can hold
# an identifier has a digit (IDENTIFIER_PATTERN's lookahead needs one in the same word). Each pattern
# runs from the first such character to the end of its word: one hit per word.
_PATH_WORD_END = re.compile(r"(?:/|\.(?=\S))\S*")
_PATH_WORD_START = re.compile(r"(?:/|\.(?<=\S\.))\S*")  # the same, over the reversed text
_DIGIT_WORD = re.compile(r"\d\S*")  # both ways: a digit reads the same reversed


class Mentions(NamedTuple):
    """What one text mentions, in order of appearance."""

    paths: tuple[str, ...]
    values: tuple[str, ...]


def scan_prose(texts: Sequence[str]) -> list[Mentions]:
    """For each text: (find_paths(strip_fences(text)), mentioned_values(text)) of scan.py."""
    prose = [strip_fences(text) for text in texts]
    joined = _SEPARATOR.join(prose)
    starts = list(accumulate([len(p) + 1 for p in prose[:-1]], initial=0))
    reversed_text = joined[::-1]
    paths = _by_text(_paths(joined, reversed_text), starts, len(texts))
    numbers = _by_text(_numbers(joined), starts, len(texts))
    identifiers = _by_text(_identifiers(joined, reversed_text), starts, len(texts))
    return [
        Mentions(tuple(p), (*n, *i)) for p, n, i in zip(paths, numbers, identifiers, strict=True)
    ]


def _by_text(hits: list[tuple[int, str]], starts: list[int], count: int) -> list[list[str]]:
    """Hits (offset in the joined text, value) grouped by the text they fall in, in order."""
    grouped: list[list[str]] = [[] for _ in range(count)]
    for offset, value in hits:
        grouped[bisect_right(starts, offset) - 1].append(value)
    return grouped


def _words(
    text: str, reversed_text: str, forward: re.Pattern[str], backward: re.Pattern[str]
) -> tuple[list[int], list[int]]:
    """(starts, ends) of the words of `text` that `forward` finds from their end and `backward`
    from their start (over the reversed text): the same words, one hit each."""
    ends = [found.end() for found in forward.finditer(text)]
    size = len(text)
    starts = [size - found.end() for found in backward.finditer(reversed_text)]
    starts.reverse()
    return starts, ends


def _in_words(
    text: str, starts: list[int], ends: list[int], pattern: re.Pattern[str]
) -> list[tuple[int, str]]:
    """`pattern`'s hits in the given words of `text` joined by spaces (a match never spans a
    space, and a space is the edge of a word to it as the text's own whitespace is), each with
    its offset in `text`."""
    words = [text[start:end] for start, end in zip(starts, ends, strict=True)]
    line = " ".join(words)
    offsets = list(accumulate([len(word) + 1 for word in words[:-1]], initial=0))
    found: list[tuple[int, str]] = []
    for match in pattern.finditer(line):
        word = bisect_right(offsets, match.start()) - 1
        found.append((starts[word] + match.start() - offsets[word], match.group()))
    return found


def _paths(text: str, reversed_text: str) -> list[tuple[int, str]]:
    starts, ends = _words(text, reversed_text, _PATH_WORD_END, _PATH_WORD_START)
    found: list[tuple[int, str]] = []
    for offset, raw in _in_words(text, starts, ends, PATH_PATTERN):
        token = raw.rstrip(PATH_TRAILING)
        if is_path_token(token):
            found.append((offset, token))
    return found


def _numbers(text: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for match in DIGITS_PATTERN.finditer(text):
        start, end = match.span()
        if not is_after_word(text, start) and (value := number_in_context(text, start, end)):
            found.append((start, value))
    return found


def _identifiers(text: str, reversed_text: str) -> list[tuple[int, str]]:
    starts, ends = _words(text, reversed_text, _DIGIT_WORD, _DIGIT_WORD)
    return _in_words(text, starts, ends, IDENTIFIER_PATTERN)


class MentionCache:
    """Each text's Mentions by its content, at most `max_chars` characters of text held (the
    least recently used go first). `scanned` counts the texts actually scanned."""

    def __init__(self, max_chars: int = 32 * 2**20) -> None:
        self.max_chars = max_chars
        self.scanned = 0
        self._held = 0
        self._found: OrderedDict[str, Mentions] = OrderedDict()

    def scan(self, texts: Sequence[str]) -> list[Mentions]:
        """`scan_prose(texts)`, scanning only the texts not seen before."""
        found = self._found
        new = list(dict.fromkeys(text for text in texts if text not in found))
        if new:
            self.scanned += len(new)
            for text, mentions in zip(new, scan_prose(new), strict=True):
                found[text] = mentions
                self._held += len(text)
        result = []
        for text in texts:
            found.move_to_end(text)
            result.append(found[text])
        while self._held > self.max_chars and len(found) > len(texts):
            text, _ = found.popitem(last=False)
            self._held -= len(text)
        return result
