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
    if text.isascii() or not _CJK_RUN.search(text):  # no CJK run, in the words or the text
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
_LETTERS = b"abcdefghijklmnopqrstuvwxyz"
_DIGITS = b"0123456789"
# A run under three characters counts only for its digits ("7", "42", "a1" → "1"): the runs of
# letters alone count for nothing, the runs of digits alone stand as they are, and only a letter
# beside a digit needs rewriting. Set differences with these (C speed, a few per key) replace a
# Python pass over every token of every key.
_SHORT_LETTER_RUNS = frozenset(
    [bytes([a]) for a in _LETTERS] + [bytes([a, b]) for a in _LETTERS for b in _LETTERS]
)
_MIXED_RUNS = frozenset(bytes(pair) for a in _LETTERS for d in _DIGITS for pair in ((a, d), (d, a)))


def ascii_key_tokens(text: str) -> set[bytes]:
    """`key_tokens(text)` of an ASCII text, each token as bytes."""
    return byte_tokens(text.encode("ascii"))


_ASCII_RUNS = re.compile(r"[\x00-\x7f]+")


def narrow_key(key: str) -> bytes | None:
    """`key` as ASCII bytes whose `byte_tokens` are its `key_tokens`: the key itself when it is
    ASCII; with every other character made "?" when none of those, casefolded, is a letter or a
    digit (quotes, dashes and ellipses in English text: separators either way); else None."""
    if key.isascii():
        return key.encode("ascii")
    # Casefolding works character by character (the ASCII ones only lowered, as the byte table
    # does), so the others decide alone whether they could be part of a token.
    if any(map(str.isalnum, _ASCII_RUNS.sub("", key).casefold())):
        return None
    return key.encode("ascii", "replace")


def byte_tokens(data: bytes) -> set[bytes]:
    """The key tokens of ASCII bytes (see `narrow_key`)."""
    # `difference`, not `-=`: the in-place form walks the whole right-hand set.
    tokens = set(data.translate(_ASCII_WORDS).split()).difference(_SHORT_LETTER_RUNS)
    if not tokens.isdisjoint(_MIXED_RUNS):
        mixed = tokens.intersection(_MIXED_RUNS)
        tokens = tokens.difference(mixed)
        tokens.update(run.translate(None, _LETTERS) for run in mixed)
    return tokens


PROBE_CHARS = 8
"""A key's normalized text can be in the summary's only if its first PROBE_CHARS characters are
one of the summary's substrings of that length: a set lookup that spares most keys a search of
the whole summary (most keys of a long fold are not in it, and each search reads the summary)."""

PROBE_SPAN = 32
"""The probe is taken from the normalized first PROBE_SPAN characters of a key (normalizing a
prefix gives a prefix of the normalized key), not from the whole key normalized."""

PROBED_KEYS = 64
"""From this many keys on, the summary's substrings are collected for the probe (it costs about
as much as a few dozen searches)."""


class SummaryIndex:
    """The summary prepared once for many `contains` checks (`keys`: about how many)."""

    def __init__(self, summary: str, *, keys: int = 1) -> None:
        self.text = comparable(summary)
        self.tokens = key_tokens(summary)
        self.ascii_tokens = {token.encode("ascii") for token in self.tokens if token.isascii()}
        self.picked = frozenset(self.ascii_tokens | _SHORT_LETTER_RUNS | _MIXED_RUNS)
        text = self.text
        self.probes: frozenset[str] | None = (
            frozenset([text[i : i + PROBE_CHARS] for i in range(len(text) - PROBE_CHARS + 1)])
            if keys >= PROBED_KEYS
            else None
        )

    def contains(self, key: str) -> bool:
        """The key's normalized text is in the summary's (or is empty), or most of its tokens
        are; the cheaper test first."""
        narrow = narrow_key(key)
        if narrow is not None:  # most keys: an ASCII token can only meet the summary's ASCII ones
            if self._overlaps(narrow):
                return True
            return self._has(key)
        if self._has(key):
            return True
        tokens = key_tokens(key)
        if not tokens:
            return False
        return len(tokens & self.tokens) >= TOKEN_OVERLAP * len(tokens)

    def _overlaps(self, narrow: bytes) -> bool:
        """Most of `byte_tokens(narrow)` are the summary's, counted without building that set.

        The runs of the key that are the summary's tokens, or runs under three characters with
        a letter (which `byte_tokens` drops, or replaces by their digit), are picked out in one
        pass; those three kinds never overlap, so the rest is arithmetic on the few picked."""
        runs = set(narrow.translate(_ASCII_WORDS).split())
        picked = runs.intersection(self.picked)
        short = picked.intersection(_SHORT_LETTER_RUNS)
        mixed = picked.intersection(_MIXED_RUNS)
        total = len(runs) - len(short) - len(mixed)
        hits = len(picked) - len(short) - len(mixed)
        if mixed:  # "a1" counts as "1" unless the key has "1" already
            digits = {run.translate(None, _LETTERS) for run in mixed}.difference(runs)
            total += len(digits)
            hits += len(digits.intersection(self.ascii_tokens))
        return total > 0 and hits >= TOKEN_OVERLAP * total

    def _has(self, key: str) -> bool:
        """The key's normalized text is empty or in the summary's; the probe asked first."""
        probes = self.probes
        if probes is not None and len(key) > PROBE_SPAN:
            head = comparable(key[:PROBE_SPAN])
            if len(head) >= PROBE_CHARS and head[:PROBE_CHARS] not in probes:
                return False
        wanted = comparable(key)
        return not wanted or wanted in self.text


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
    unique = list(filter(str.strip, dict.fromkeys(keys)))  # C speed: a key per folded request
    index = SummaryIndex(summary, keys=len(unique))
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
    index = SummaryIndex(summary, keys=len(items))
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
