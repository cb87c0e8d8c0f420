"""Plain-text operations the library shares: clipping, normalizing, telling CJK text apart.

One definition of each: the transcript, the ledger and the summary body clip the same way, the
memory file and verification compare the same normalized text, and "a CJK character counts as
a word" means the same characters everywhere (the token estimator's rate classes are a separate,
tokenizer-fitted matter: see tokens.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import filterfalse

CJK_LETTERS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
"""Kana, CJK ideographs and Hangul syllables: the characters that count as words on their own
(a character class body, for use inside `[...]`)."""

CJK_LETTER = re.compile(f"[{CJK_LETTERS}]")
_ASCII_NON_LETTERS = bytes(c for c in range(128) if not chr(c).isalpha())
_WIDE_LETTER = re.compile(r"[^\W\d_\x00-\x7f]")
SENTENCE_CHARS = 300
SENTENCE_TEXT_CHARS = 6000
_WORD_WITH_DIGIT = re.compile(r"\S*\d\S*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])\s*|\n+")


def is_cjk_dominant(texts: Iterable[str]) -> bool:
    """True when at least a quarter of the letters (`str.isalpha`) are CJK (they carry more per
    character).

    Counted at C speed over whole texts: the texts are joined, the ASCII ones apart from the
    others (`str.isascii` is a flag); CJK letters by one regular expression over the texts that
    are not ASCII, first: with none (most histories) the answer is no, and the ASCII letters of
    the rest are not counted at all. Then ASCII letters by `bytes.translate` (of a first slice,
    if that settles it); the other wide letters only when the bounds they lie between leave the
    answer open.
    """
    listed = list(texts)
    wide_text = "".join(filterfalse(str.isascii, listed))
    cjk = len(wide_text) - len(CJK_LETTER.sub("", wide_text))
    if cjk == 0:
        return False
    narrow_text = "".join(filter(str.isascii, listed)).encode()
    # The letters of a slice of the ASCII text are fewer than all letters: often enough already
    # to answer no (a few CJK characters quoted in English), without counting the rest.
    if cjk * 3 < len(narrow_text[: 16 * cjk + 4096].translate(None, _ASCII_NON_LETTERS)):
        return False
    narrow = wide_text.encode("ascii", "ignore")
    ascii_letters = len(narrow_text.translate(None, _ASCII_NON_LETTERS)) + len(
        narrow.translate(None, _ASCII_NON_LETTERS)
    )
    wide = len(wide_text) - len(narrow)
    if cjk * 4 < ascii_letters + cjk:  # not even if no other wide one is a letter
        return False
    if cjk * 4 >= ascii_letters + wide:  # even if every wide character is a letter
        return True
    return cjk * 4 >= ascii_letters + len(_WIDE_LETTER.findall(wide_text))


def is_collapsed(text: str) -> bool:
    """`text` is its own `collapse_spaces`: every whitespace character but the space is
    unprintable, so a printable text without two spaces in a row nor one at either end has
    nothing to collapse. A few scans in C, where collapsing splits the text into words."""
    return text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " "


def collapse_spaces(text: str) -> str:
    """`text` with every run of whitespace made one space, and trimmed.

    `str.split` and `\\s` agree on what whitespace is (`str.isspace`); split-and-join is four
    times faster than the regex substitution. Most texts have nothing to collapse
    (`is_collapsed`) and come back as they are, without a word list built and joined."""
    return text if is_collapsed(text) else " ".join(text.split())


def normalize(text: str) -> str:
    """What two texts must share to count as the same: spacing and case aside (ASCII text
    casefolds as it lowers, which has a faster path)."""
    collapsed = collapse_spaces(text)
    return collapsed.lower() if collapsed.isascii() else collapsed.casefold()


def clip_end(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail and saying how much went."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return f"[… {len(text)} chars omitted …]"
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[… {omitted} chars omitted …]\n{text[len(text) - tail :]}"


def split_sentences(text: str) -> list[str]:
    """The sentences (and lines) of `text`, each stripped, none empty."""
    return [s for s in map(str.strip, _SENTENCE_END.split(text)) if s]


def sentences_holding(text: str, values: Sequence[str]) -> tuple[str, ...]:
    """Each of `values` (found in `text`) as the sentence of `text` it came in, each sentence
    once: "2026-11-15" means nothing without "the launch deadline is 2026-11-15". A text longer
    than SENTENCE_TEXT_CHARS (pasted output, not prose) keeps its values as they are."""
    if len(text) > SENTENCE_TEXT_CHARS:
        return tuple(values)
    sentences = list(map(collapse_spaces, split_sentences(text)))
    found: dict[str, None] = {}
    for value in values:
        word = _WORD_WITH_DIGIT.search(value)  # the number or identifier, not its context
        core = word.group(0) if word else value
        sentence = next((s for s in sentences if core in s), value)
        found[clip_end(sentence, SENTENCE_CHARS)] = None
    return tuple(found)
