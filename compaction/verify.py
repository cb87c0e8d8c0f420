"""Verification: are the key items and ledger entries still findable in the summary?

A key counts as preserved when its normalized text is a substring of the normalized summary, or
when most of its key tokens (words of three or more characters, CJK character pairs) occur in it.
Missing keys can be appended to the summary under a budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from compaction.text import CJK_LETTERS, normalize
from compaction.types import MemoryItem, Quality, Verification

GOOD_RATIO = 0.9
ACCEPTABLE_RATIO = 0.6
TOKEN_OVERLAP = 0.7
ALSO_PRESERVED = "## Also preserved"


_WORD = re.compile(r"[^\W_]{3,}|\d+", re.UNICODE)
_CJK_RUN = re.compile(f"[{CJK_LETTERS}]+")


def comparable(text: str) -> str:
    """`text` normalized, backticks (markdown code) left out: how keys meet the summary."""
    return normalize(text.replace("`", ""))


def key_tokens(text: str) -> set[str]:
    """Words of three or more letters or digits, and pairs of adjacent CJK characters."""
    if text.isascii():  # no CJK run to look for, in the words or the text (most keys)
        return set(_WORD.findall(text.casefold()))
    tokens = {w for w in _WORD.findall(text.casefold()) if not _CJK_RUN.fullmatch(w)}
    for run in _CJK_RUN.findall(text):
        tokens.update(run[i : i + 2] for i in range(max(len(run) - 1, 1)))
    return tokens


# An ASCII key's tokens as bytes, found without a regex: every byte that is not a letter or a
# digit made a space (letters lowered) by one `bytes.translate`, then split; the regex above costs
# about twice as much per key, and verification reads one key per folded request.
_ASCII_WORDS = (
    bytes(ord(chr(c).lower()) if chr(c).isalnum() else ord(" ") for c in range(128)) + b" " * 128
)
_LOWER_LETTERS = b"abcdefghijklmnopqrstuvwxyz"


def ascii_key_tokens(text: str) -> set[bytes]:
    """`key_tokens(text)` of an ASCII text, each token as bytes."""
    tokens = set(text.encode("ascii").translate(_ASCII_WORDS).split())
    short = [run for run in tokens if len(run) < 3]
    if short:  # a run under three characters counts only for its digits ("7", "42", "a1" → "1")
        tokens.difference_update(short)
        tokens.update(digits for run in short if (digits := run.translate(None, _LOWER_LETTERS)))
    return tokens


class SummaryIndex:
    """The summary prepared once for many `contains` checks."""

    def __init__(self, summary: str) -> None:
        self.text = comparable(summary)
        self.tokens = key_tokens(summary)
        self.ascii_tokens = {token.encode("ascii") for token in self.tokens if token.isascii()}

    def contains(self, key: str) -> bool:
        wanted = comparable(key)
        if not wanted or wanted in self.text:
            return True
        if key.isascii():  # most keys: an ASCII token can only meet the summary's ASCII ones
            found = ascii_key_tokens(key)
            return bool(found) and len(found & self.ascii_tokens) >= TOKEN_OVERLAP * len(found)
        tokens = key_tokens(key)
        if not tokens:
            return False
        return len(tokens & self.tokens) >= TOKEN_OVERLAP * len(tokens)


def grade(preserved: int, total: int) -> Quality:
    ratio = preserved / total if total else 1.0
    if ratio >= GOOD_RATIO:
        return "good"
    if ratio >= ACCEPTABLE_RATIO:
        return "acceptable"
    return "poor"


def check_preserved(
    keys: Sequence[str], summary: str, *, moved_to_memory: bool = False
) -> Verification:
    """Which of `keys` (deduplicated, in order) the summary preserves, and the grade; with
    `moved_to_memory`, the missing ones were written to the memory file and are counted so."""
    unique = list(dict.fromkeys(k for k in keys if k.strip()))
    index = SummaryIndex(summary)
    missing = tuple(k for k in unique if not index.contains(k))
    preserved = len(unique) - len(missing)
    return Verification(
        quality=grade(preserved, len(unique)),
        missing_key_info=missing,
        key_decisions_preserved=preserved,
        key_decisions_total=len(unique),
        moved_to_memory=len(missing) if moved_to_memory else 0,
    )


def missing_items(items: Sequence[MemoryItem], summary: str) -> list[MemoryItem]:
    index = SummaryIndex(summary)
    return [item for item in items if not index.contains(item.content)]


def append_missing(
    summary: str, items: Sequence[MemoryItem], *, fits: Callable[[str], bool]
) -> str:
    """`summary` with as many of the missing `items` as `fits` allows, in an "Also preserved" list."""
    text = summary
    section = f"\n\n{ALSO_PRESERVED}"
    for item in items:
        line = f"\n- ({item.type}) {item.content}"
        candidate = f"{text}{section}{line}"
        if not fits(candidate):
            continue
        text, section = candidate, ""
    return text
