"""Plain-text operations the library shares: clipping, normalizing, telling CJK text apart.

One definition of each: the transcript, the ledger and the summary body clip the same way, the
memory file and verification compare the same normalized text, and "a CJK character counts as
a word" means the same characters everywhere (the token estimator's rate classes are a separate,
tokenizer-fitted matter: see tokens.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

CJK_LETTERS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
"""Kana, CJK ideographs and Hangul syllables: the characters that count as words on their own
(a character class body, for use inside `[...]`)."""

CJK_LETTER = re.compile(f"[{CJK_LETTERS}]")
_ASCII_NON_LETTERS = bytes(c for c in range(128) if not chr(c).isalpha())
_WIDE_LETTER = re.compile(r"[^\W\d_\x00-\x7f]")


def is_cjk_dominant(texts: Iterable[str]) -> bool:
    """True when at least a quarter of the letters (`str.isalpha`) are CJK (they carry more per
    character).

    Counted at C speed over whole texts: ASCII letters by `bytes.translate`, CJK letters by one
    regular expression over the texts that are not ASCII; the other wide letters are counted only
    when the bounds they lie between leave the answer open.
    """
    cjk = ascii_letters = wide = 0
    wide_texts = []
    for text in texts:
        narrow = text.encode("ascii", "ignore")
        ascii_letters += len(narrow.translate(None, _ASCII_NON_LETTERS))
        if len(narrow) != len(text):
            wide += len(text) - len(narrow)
            cjk += len(text) - len(CJK_LETTER.sub("", text))
            wide_texts.append(text)
    if cjk == 0 or cjk * 4 < ascii_letters + cjk:  # not even if no other wide one is a letter
        return False
    if cjk * 4 >= ascii_letters + wide:  # even if every wide character is a letter
        return True
    letters = ascii_letters + sum(len(_WIDE_LETTER.findall(text)) for text in wide_texts)
    return cjk * 4 >= letters


def collapse_spaces(text: str) -> str:
    """`text` with every run of whitespace made one space, and trimmed.

    `str.split` and `\\s` agree on what whitespace is (`str.isspace`); split-and-join is four
    times faster than the regex substitution. Most texts have nothing to collapse: every
    whitespace character but the space is unprintable, so a printable text without two spaces
    in a row nor one at either end comes back as it is, without a word list built and joined."""
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text
    return " ".join(text.split())


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
