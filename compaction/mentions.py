"""What the prose of many folded messages mentions (paths, numbers, identifiers), in one pass.

`scan_prose(texts)` gives, for each text, what `scan.find_paths(strip_fences(text))` and
`scan.mentioned_values(text)` give, but scans the texts joined into one string: each compiled
regular expression runs once over the whole text (a few calls in C instead of a few per message),
and each hit is mapped back to its text by bisecting the texts' offsets.

The joined texts are separated by a newline: every finder reads a newline as the edge of a word
and of a line, which is what the start and end of a text are to it, so no hit spans two texts and
none changes. Only the words that can hold a hit are read (as scan.py reads only those), found
by two scans, forwards and over the reversed text, of a pattern that opens with a character
class the regex engine skips to in C: one hit per candidate word gives its end, one per word of
the reversed text its start. Those words, joined, are all the finders then read.

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
# a number or an identifier has a digit (IDENTIFIER_PATTERN's lookahead needs one in the same
# word). Each pattern runs from the first such character to the end of its word: one hit per
# word; the second reads the reversed text, where a dot before a character comes after one.
# Both open with a plain class (the dot's condition checked after it): the engine skips to a
# class in C, where an alternation that opens with a category is tried at every position.
_WORD_END = re.compile(r"[\d/.](?:(?<!\.)|(?=\S))\S*")
_WORD_START = re.compile(r"[\d/.](?:(?<!\.)|(?<=\S\.))\S*")


Mentions = tuple[tuple[str, ...], tuple[str, ...]]
"""What one text mentions, in order of appearance: (paths, values). A plain tuple: a NamedTuple
costs a microsecond more to build, and there is one per folded message."""


def scan_prose(texts: Sequence[str]) -> list[Mentions]:
    """For each text: (find_paths(strip_fences(text)), mentioned_values(text)) of scan.py."""
    prose = [strip_fences(text) for text in texts]
    joined = _SEPARATOR.join(prose)
    starts = list(accumulate([len(p) + 1 for p in prose[:-1]], initial=0))
    words = _Words(joined)
    paths = _by_text(_paths(words), starts, len(texts))
    numbers = _by_text(_numbers(joined, words), starts, len(texts))
    identifiers = _by_text(words.find(IDENTIFIER_PATTERN), starts, len(texts))
    return [(tuple(p), (*n, *i)) for p, n, i in zip(paths, numbers, identifiers, strict=True)]


def _by_text(hits: list[tuple[int, str]], starts: list[int], count: int) -> list[list[str]]:
    """Hits (offset in the joined text, value) grouped by the text they fall in, in order."""
    grouped: list[list[str]] = [[] for _ in range(count)]
    for offset, value in hits:
        grouped[bisect_right(starts, offset) - 1].append(value)
    return grouped


class _Words:
    """The words of a text that can hold a path, a number or an identifier, joined by spaces:
    a match of those patterns never spans a space, and a space is the edge of a word to them as
    the text's own whitespace is, so they find in this line what they would find in the text."""

    def __init__(self, text: str) -> None:
        self.ends = [found.end() for found in _WORD_END.finditer(text)]
        size = len(text)
        self.starts = [size - found.end() for found in _WORD_START.finditer(text[::-1])]
        self.starts.reverse()
        words = [text[start:end] for start, end in zip(self.starts, self.ends, strict=True)]
        self.line = " ".join(words)
        self.offsets = list(accumulate([len(word) + 1 for word in words[:-1]], initial=0))

    def find(self, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
        """`pattern`'s hits, each with its offset in the text."""
        return [(self.in_text(m.start()), m.group()) for m in pattern.finditer(self.line)]

    def in_text(self, offset: int) -> int:
        word = bisect_right(self.offsets, offset) - 1
        return self.starts[word] + offset - self.offsets[word]


def _paths(words: _Words) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for offset, raw in words.find(PATH_PATTERN):
        token = raw.rstrip(PATH_TRAILING)
        if is_path_token(token):
            found.append((offset, token))
    return found


def _numbers(text: str, words: _Words) -> list[tuple[int, str]]:
    """Numbers with their context, read from the text around each run of digits."""
    found: list[tuple[int, str]] = []
    for offset, digits in words.find(DIGITS_PATTERN):
        end = offset + len(digits)
        if not is_after_word(text, offset) and (value := number_in_context(text, offset, end)):
            found.append((offset, value))
    return found


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
