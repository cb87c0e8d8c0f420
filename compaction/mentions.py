"""What the prose of many folded messages mentions (paths, numbers, identifiers), in one pass.

`scan_prose(texts)` gives, for each text, what `scan.find_paths(strip_fences(text))` and
`scan.mentioned_values(text)` give, but scans the texts joined into one string: each compiled
regular expression runs once over the whole text (a few calls in C instead of a few per message),
and each hit is mapped back to its text by bisecting the texts' offsets.

The joined texts are separated by a newline: every finder reads a newline as the edge of a word
and of a line, which is what the start and end of a text are to it, so no hit spans two texts and
none changes. Only the words that can hold a hit are read (as scan.py reads only those): one scan
finds each from its first character that can hold a hit (a pattern that opens with a character
class the regex engine skips to in C), and one short match over the reversed text per word finds
its start. Those words, joined into a line (the words with a slash or a known extension for
paths, those with a digit for numbers and identifiers), are all the finders then read; the hits
go back to their texts by offsets summed and bisected by `map` over C functions, not by a Python
step per hit. `find_paths_each` does the same for the paths of shell commands.

`MentionCache` keeps each text's result by its content, so a compaction that folds messages an
earlier one already read (a precomputed compaction redone over a longer history) scans only the
new ones.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, compress, filterfalse, islice, repeat
from operator import add, contains, getitem, methodcaller, or_, sub

from compaction.scan import (
    CODE_EXTENSIONS,
    IDENTIFIER_PATTERN,
    PATH_PATTERN,
    PATH_TRAILING,
    is_path_token,
    number_in_context,
    strip_fences,
)

_SEPARATOR = "\n"
# A word that can hold a path has a slash or a dot before its last character; one that can hold
# a number or an identifier has a digit (IDENTIFIER_PATTERN's lookahead needs one in the same
# word). The pattern runs from the first such character to the end of its word: one hit per
# word. It opens with a plain class (the dot's condition checked after it): the engine skips to
# a class in C, where an alternation that opens with a category is tried at every position; and
# to a class of ASCII digits twice as fast as to `\d`, which is what it reads in texts without
# other digits (`_WIDE_DIGIT`: Arabic-Indic, fullwidth, ...), nearly all of them.
_WORD_END = re.compile(r"[\d/.](?:(?<!\.)|(?=\S))\S*+")
_ASCII_WORD_END = re.compile(r"[0-9/.](?:(?<!\.)|(?=\S))\S*+")
_WIDE_DIGIT = re.compile(r"[^\D0-9]")
_PATHLIKE_END = re.compile(r"[/.](?:(?<!\.)|(?=\S))\S*+")
_BACK = re.compile(r"\S*")
_START = methodcaller("start")
_END = methodcaller("end")
# The finders of scan.py as one group each, to split a line by (see _Line.find).
_PATH = re.compile(f"({PATH_PATTERN.pattern})", PATH_PATTERN.flags)
_IDENTIFIER = re.compile(f"({IDENTIFIER_PATTERN.pattern})", IDENTIFIER_PATTERN.flags)
_DIGIT = re.compile(r"\d")
# DIGITS_PATTERN's runs that no word character precedes (scan.is_after_word): the lookbehind
# comes after the first digit, so the pattern still opens with a class the engine skips to.
_DIGIT_RUN = re.compile(r"(\d(?<!\w\d)\d\d+)")
_BUT_LAST = slice(None, -1)
# A known extension after a dot, as PATH_PATTERN (IGNORECASE) reads one, written for speed:
# letters spelled as classes, with the other characters IGNORECASE matches them to (`ı` and `İ`
# for i, the Kelvin sign for k, `ſ` for s), in a tree of branches by first letter, after a
# class of the first letters. The engine tests a class that opens a branch in C and skips the
# branch at once; most dots in code (`self.patch.draw(x)`) fail the first test.
_CASELESS = {"i": "iIıİ", "k": "kK\u212a", "s": "sS\u017f"}


def _caseless(letter: str) -> str:
    return _CASELESS.get(letter, letter + letter.upper())


def _branches(words: Iterable[str]) -> str:
    """An alternation matching exactly `words` (lowercase letters, any case), as a tree."""
    by_first: dict[str, list[str]] = {}
    for word in sorted(words):
        by_first.setdefault(word[0], []).append(word[1:])
    branches = []
    for first, rests in by_first.items():
        longer = [rest for rest in rests if rest]
        then = f"(?:{_branches(longer)})" if longer else ""
        optional = "?" if longer and "" in rests else ""
        branches.append(f"[{_caseless(first)}]{then}{optional}")
    return "|".join(branches)


_FIRST_LETTERS = "".join(sorted({_caseless(extension[0]) for extension in CODE_EXTENSIONS}))
_EXTENSION = re.compile(rf"\.(?=[{_FIRST_LETTERS}])(?:{_branches(CODE_EXTENSIONS)})\b")


Mentions = tuple[tuple[str, ...], tuple[str, ...]]
"""What one text mentions, in order of appearance: (paths, values). A plain tuple: a NamedTuple
costs a microsecond more to build, and there is one per folded message."""


def scan_prose(texts: Sequence[str]) -> list[Mentions]:
    """For each text: (find_paths(strip_fences(text)), mentioned_values(text)) of scan.py."""
    prose = [strip_fences(text) for text in texts]
    joined = _SEPARATOR.join(prose)
    texts_at = _texts_at(prose)
    wide = _WIDE_DIGIT.search(_SEPARATOR.join(filterfalse(str.isascii, prose)))
    words = _Words(joined, _WORD_END if wide else _ASCII_WORD_END)
    path_at, paths = _paths(words.paths())
    digits = words.digits()
    number_at, numbers = _numbers(joined, digits)
    identifier_at, identifiers = digits.find(_IDENTIFIER)
    count = len(texts)
    by_text = zip(
        texts_at.group(path_at, paths, count),
        map(
            add,
            texts_at.group(number_at, numbers, count),
            texts_at.group(identifier_at, identifiers, count),
        ),
        strict=True,
    )
    return list(by_text)


def find_paths_each(texts: Sequence[str]) -> list[tuple[str, ...]]:
    """`scan.find_paths` of each text (shell commands, say), all found at once as scan_prose
    finds them: only the words with a slash or a dot can hold a path."""
    words = _Words(_SEPARATOR.join(texts), _PATHLIKE_END)
    path_at, paths = _paths(words.paths())
    return list(_texts_at(texts).group(path_at, paths, len(texts)))


def _texts_at(texts: Sequence[str]) -> _Numbering:
    """Each hit's text (its number, 1 for the first) from the offsets the texts start at once
    joined."""
    return _Numbering(list(accumulate([len(text) + 1 for text in texts[:-1]], initial=0)))


class _Numbering:
    """Which of the sorted `starts` each offset is at or after, counted from 1, found by one
    bisection per offset called from C (a `map`, no Python frame per hit)."""

    def __init__(self, starts: list[int]) -> None:
        self.starts = starts

    def number(self, offsets: Iterable[int]) -> list[int]:
        return list(map(bisect_right, repeat(self.starts), offsets))

    def group(
        self, offsets: list[int], values: tuple[str, ...], count: int
    ) -> Iterator[tuple[str, ...]]:
        """The values of each of `count` texts, in order, as slices of `values`: a text's hits
        are a run of them, since the offsets rise."""
        if not offsets:
            return repeat((), count)  # prose often names no path at all
        # Where each text's run begins: the hits before its start (one bisection per text).
        cuts = [*map(bisect_left, repeat(offsets), self.starts), len(offsets)]
        return map(values.__getitem__, map(slice, cuts, islice(cuts, 1, None)))


class _Words:
    """The words of a text that can hold a path, a number or an identifier (a run of
    non-spaces with a digit, a slash, or a dot before its last character).

    A word is found from its first character that can hold a hit (forwards, by a pattern the
    engine skips to in C) to its end; its start is where the run of non-spaces before that
    character begins, read from the reversed text. Both are done by `map` over C functions: no
    Python frame per word."""

    def __init__(self, text: str, finder: re.Pattern[str]) -> None:
        size = len(text)
        found = list(finder.finditer(text))
        ends = list(map(_END, found))
        reverse = text[::-1]
        behind = map(_BACK.match, repeat(reverse), map(sub, repeat(size), map(_START, found)))
        self.starts = list(map(sub, repeat(size), map(_END, behind)))
        self.words = list(map(text.__getitem__, map(slice, self.starts, ends)))
        # As scan.find_paths reads them: a slash, or a dot before the last character.
        slashed = map(contains, self.words, repeat("/"))
        dotted = map(contains, map(getitem, self.words, repeat(_BUT_LAST)), repeat("."))
        self.pathlike = list(map(or_, slashed, dotted))

    def paths(self) -> _Line:
        """The words that can hold a path: PATH_PATTERN reads a slash, or a dot before a known
        extension (most dotted words in code, `self.patch.draw(x)`, have neither). The
        extensions are found by one search over the words with a slash or a dot."""
        dotted = self._line(self.pathlike)
        named = dotted.words.number(map(_START, _EXTENSION.finditer(dotted.text)))
        chosen = list(map(contains, self.words, repeat("/")))
        for word in named:  # counted from 1 among the dotted words
            chosen[dotted.chosen[word - 1]] = True
        return self._line(chosen)

    def digits(self) -> _Line:
        """The words that can hold a number or an identifier (both need a digit in their
        word): every word that cannot hold a path, since it was taken for a digit, and
        those that can which have one."""
        pathlike = compress(self.words, self.pathlike)
        digits = iter(list(map(bool, map(_DIGIT.search, pathlike))))
        return self._line([next(digits) if p else True for p in self.pathlike])

    def _line(self, chosen: list[bool]) -> _Line:
        return _Line(
            list(compress(self.starts, chosen)),
            list(compress(self.words, chosen)),
            list(compress(range(len(chosen)), chosen)),
        )


class _Line:
    """Words of a text joined by spaces: a match of the finders never spans a space, and a space
    is the edge of a word to them as the text's own whitespace is, so they find in this line
    what they would find in the text."""

    def __init__(self, starts: list[int], words: list[str], chosen: list[int]) -> None:
        self.text = " ".join(words)
        self.chosen = chosen
        """Which of the words it was made from each of its words is."""
        offsets = list(accumulate(map(add, map(len, words), repeat(1)), initial=0))
        # A hit at line offset o in word w is at o + starts[w] - offsets[w] in the text; the
        # shift is kept one place on, where bisect_right(offsets, o) finds it.
        self.words = _Numbering(offsets[:-1])
        self.shifts = [0, *map(sub, starts, offsets)]

    def find(self, pattern: re.Pattern[str]) -> tuple[list[int], tuple[str, ...]]:
        """The hits of `pattern` (one group, the whole match): their offsets in the text, and
        their values. Split by it, the line alternates the text between hits and the hits, so
        each hit's offset is the length of all the parts before it: no match object per hit."""
        parts = pattern.split(self.text)
        at = list(islice(accumulate(map(len, parts)), 0, len(parts) - 1, 2))
        shifts = map(self.shifts.__getitem__, self.words.number(at))
        return list(map(add, at, shifts)), tuple(islice(parts, 1, None, 2))


def _paths(line: _Line) -> tuple[list[int], tuple[str, ...]]:
    at, raw = line.find(_PATH)
    tokens = list(map(methodcaller("rstrip", PATH_TRAILING), raw))
    # A path is named again and again: each token is judged once.
    verdicts = {token: is_path_token(token) for token in dict.fromkeys(tokens)}
    kept = list(map(verdicts.__getitem__, tokens))
    return list(compress(at, kept)), tuple(compress(tokens, kept))


def _numbers(text: str, line: _Line) -> tuple[list[int], tuple[str, ...]]:
    """Numbers with their context, read from the text around each run of digits."""
    at, digits = line.find(_DIGIT_RUN)
    values = list(map(number_in_context, repeat(text), at, map(add, at, map(len, digits))))
    kept = list(map(bool, values))
    return list(compress(at, kept)), tuple(compress(values, kept))


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
        new = list(dict.fromkeys(filterfalse(found.__contains__, texts)))
        scanned = scan_prose(new) if new else []
        if new:
            self.scanned += len(new)
            found.update(zip(new, scanned, strict=True))
            self._held += sum(map(len, new))
        if len(new) == len(texts):
            result = scanned  # all new and distinct: the most recent already, in their order
        else:
            # Each text as the most recently used, in order (each call returns None: `any`
            # runs them all, in C).
            any(map(found.move_to_end, texts))
            result = list(map(found.__getitem__, texts))
        # Past the bound even this call's texts go, the earliest first (its answer is built):
        # a fold of tens of MiB would otherwise stay held whole until the next.
        while self._held > self.max_chars:
            text, _ = found.popitem(last=False)
            self._held -= len(text)
        return result
