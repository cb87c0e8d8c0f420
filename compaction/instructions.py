"""Standing instructions: what the user said that holds until the user says otherwise.

Every statement in a user turn that lays down a rule, a constraint, a decision, a preference, a
goal or a fact the work depends on is kept verbatim (whitespace collapsed) as an `Instruction`.
The summary carries them in a pinned section of their own (pinned.py), ranked by kind (rules
first), never by recency; a statement made twice is kept once; a later statement about the same
subject with other values supersedes the earlier one, and both stay visible as such.

Found by cue words, each kind's a compiled expression, over all the user's texts read at once
(`_sentence_kinds_each`): no model is asked.
"""

from __future__ import annotations

import re
import string
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import accumulate
from math import ceil
from typing import Literal

from compaction.messages import Item
from compaction.scan import strip_fences
from compaction.text import collapse_spaces, normalize
from compaction.types import MemoryType

Kind = Literal["rule", "constraint", "decision", "preference", "goal", "fact"]
KINDS: tuple[Kind, ...] = ("rule", "constraint", "decision", "preference", "goal", "fact")
"""In the order the section lists them: what must never happen first, background last."""

MEMORY_TYPE: dict[Kind, MemoryType] = {
    "rule": "preference",
    "constraint": "preference",
    "decision": "decision",
    "preference": "preference",
    "goal": "todo",
    "fact": "fact",
}
"""The memory file's type of an instruction that had no room in the section."""

WHOLE_MESSAGE_CHARS = 400
"""A user message up to this long that holds an instruction is kept whole (its sentences explain
one another: "Budget cap is $500. Never exceed it."); a longer one gives only its instructing
sentences."""
MAX_SENTENCE_CHARS = 400
MIN_SENTENCE_CHARS = 8
SUPERSEDING_OVERLAP = 0.5
"""Two statements of one kind whose subject words overlap this much (Jaccard) but whose values
differ are about the same thing: the later one supersedes the earlier."""
_OVERLAP = Fraction(SUPERSEDING_OVERLAP)
# Of two subjects that overlap by _OVERLAP, the smaller holds this share of the overlap's words.
_FILED_OVERLAP = 2 * _OVERLAP / (1 + _OVERLAP)


def _alternation(words: Sequence[str], cjk: Sequence[str] = ()) -> str:
    """`(?:words)(?!\\w)|cjk` written for the regex engine's speed: one branch per first letter.

    Every branch opens with a literal character, so the engine skips in C to the positions that
    hold one and tries there only the branch of that letter; an alternation that opens with a
    group (`(?:safety )?rules?:`) is tried in full at every position. The words of one letter
    keep their order (the first that matches wins, as in a plain alternation), so every position
    matches exactly as `(?:words)(?!\\w)|cjk` does. No leading `\\b`: where a hit starts is
    checked on the few hits (`_starts_a_word`)."""
    by_first: dict[str, list[str]] = {}
    for word in words:
        by_first.setdefault(word[0], []).append(f"{word[1:]}(?!\\w)")
    branches = [f"{first}(?:{'|'.join(rests)})" for first, rests in by_first.items()]
    return "|".join([*branches, *cjk])


# Phrases (expressions over lowercased text, each opening with a letter) that end where a word
# ends, and CJK ones.
_CUE_WORDS: dict[Kind, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rule": (
        (
            *("safety rules?:", "rules?:", "never", "always", "must(?:n't| not)?", "do not"),
            *("don't", "shall not", "under no circumstances", "not allowed", "forbidden"),
            *("prohibited", "make sure", "from now on", "at all times"),
            "without (?:explicit |prior )?(?:approval|consent|permission)",
        ),
        ("禁止", "不要", "不许", "必须", "务必", "永远不", "总是"),
    ),
    "constraint": (
        (
            *("hard constraints?:", "constraints?:", "limits?:", "caps?", "capped"),
            *("limit(?:ed)?", "at most", "at least", "no more than", "maximum", "minimum"),
            *("exceed\\w*", "budget", "deadline", "due (?:on|by)"),
            "only \\w+(?: \\w+)? (?:may|can|is allowed)",
            *("fixed at", "does not move", "no later than"),
        ),
        ("上限", "预算", "截止", "最多", "不超过"),
    ),
    "decision": (
        (
            *("decisions?:", "decided", "we decide", "let's go with", "let's use", "we'll use"),
            *("we will use", "going with", "agreed", "we chose", "settled on"),
        ),
        ("决定", "就用", "我们用"),
    ),
    "preference": (
        (
            *("user preferences?:", "preferences?:", "i(?:'d| would)? prefer", "prefers?"),
            *("i like", "i want", "wants"),
            "please (?:always|never|use|avoid|keep|answer|write|reply)",
            *("rather than", "instead of", "style"),
        ),
        ("偏好", "喜欢", "请用"),
    ),
    "goal": (
        (
            *("goals?(?: state)?:", "goal is", "aim is", "objective", "next step", "next up"),
            *("the task is", "current task", "we are (?:working|in phase)", "milestone"),
            "phase \\d",
        ),
        ("目标", "下一步"),
    ),
    "fact": (("facts?:", "notes?:", "fyi"), ()),
}
_CUES: dict[Kind, re.Pattern[str]] = {
    kind: re.compile(_alternation(*words)) for kind, words in _CUE_WORDS.items()
}
# A fact without a label: a statement ("is", "runs", "lives"…) holding a specific value.
_STATEMENT_WORDS = (
    *("is", "are", "was", "were", "runs", "lives", "belongs", "hosted", "located", "based"),
    *("uses", "called", "named"),
)
# The scans over all the texts at once (see `_sentence_kinds_each`): the texts that hold any cue,
# and the statement words. A word counts where it starts a word: after a character that is no
# letter or digit, which these match first (a class the engine skips to in C), so that the
# letters inside words are passed over in C; `[^a-z0-9]` over lowercased text also lets through
# a letter outside ASCII, which `_starts_a_word` then rules out (for `_ANY_CUE`, the exact
# scans of each kind over the texts it names do).
_ANY_CUE = re.compile(
    f"[^a-z0-9](?:{_alternation([w for words, _ in _CUE_WORDS.values() for w in words])})"
)
_ANY_CJK_CUE = re.compile("|".join(c for _, cjk in _CUE_WORDS.values() for c in cjk))
_STATEMENT = re.compile(f"[^a-z0-9](?:{_alternation(_STATEMENT_WORDS)})")
_CJK_STATEMENT = re.compile("[是在]")
_VALUE = re.compile(
    r"\$?\d[\w./:-]*|https?://\S+|\b[\w.-]+/[\w./-]+|\b[A-Z][A-Z0-9]*-[A-Z0-9-]+\b"
    r"|(?<=\w )[A-Z][a-z]+(?: [A-Z][a-z]+)*"
)
# What every value holds (a digit or a slash; capitals before a dash, or a capitalised word
# after another word), each found by a scan that skips in C to its first character: a sentence
# without either holds no value, and `_VALUE` (tried at every position) is not run over it.
_DIGIT_OR_SLASH = re.compile(r"[\d/]")
_CAPITALS = re.compile(r"[A-Z](?:[A-Z0-9]*-|(?<=\w [A-Z])[a-z])")
_LABEL = re.compile(
    r"\W*(?:\w+ )?(rule|constraint|decision|preference|goal|fact|note)s?\b[\w ]{0,12}:",
    re.IGNORECASE,
)
_LABELS: dict[str, Kind] = {
    "rule": "rule",
    "constraint": "constraint",
    "decision": "decision",
    "preference": "preference",
    "goal": "goal",
    "fact": "fact",
    "note": "fact",
}
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# A sentence runs to its end mark (a dot in "3.11" or "e.g.x" is none) or the end of its line.
# (A run of plain characters taken at once: the same spans as one character a step, 3x faster.)
_SENTENCE = re.compile(r"(?:[^.!?。！？\n]++|[.!?](?![\s]|\Z))+[.!?。！？]*")
_TAGGED = re.compile(r"<([A-Za-z_][\w-]*)(?:\s[^>]*)?>.*?</\1>", re.DOTALL)
_SUBJECT_WORD = re.compile(r"[^\W\d_]{3,}")
_STEM = re.compile(r"(?:ing|ed|es|s)$")
_DOUBLED = re.compile(r"([b-df-hj-np-tv-z])\1$")
_COMMON = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "that",
        "this",
        "are",
        "was",
        "were",
        "has",
        "have",
        "not",
        "you",
        "your",
        "our",
        "its",
        "from",
        "into",
        "all",
        "any",
        "use",
    ]
)


@dataclass(frozen=True)
class Instruction:
    kind: Kind
    text: str
    superseded: bool = False
    """A later statement of the user changes this one (it stays listed, marked so)."""

    @property
    def identity(self) -> str:
        return normalize(self.text).rstrip(".。!！")


def find_instructions(items: Iterable[Item]) -> list[Instruction]:
    """The standing instructions in what the user wrote (tool observations and tagged blocks
    a client injects, such as `<environment_context>`, are not the user speaking)."""
    said = [_said(item.text) for item in items if item.is_request]
    found: list[Instruction] = []
    for text, kinds in zip(said, _sentence_kinds_each(said), strict=True):
        found += _instructions_in(text, kinds)
    return found


def _said(text: str) -> str:
    return _TAGGED.sub(" ", strip_fences(text)) if "<" in text or "```" in text else text


def _instructions_in(said: str, kinds: list[tuple[str, Kind]]) -> list[Instruction]:
    chosen = [(s, k) for s, k in kinds if len(s) >= MIN_SENTENCE_CHARS]
    if not chosen:
        return []
    whole = collapse_spaces(said)
    if len(whole) <= WHOLE_MESSAGE_CHARS:
        return [Instruction(chosen[0][1], whole)]
    return [Instruction(k, s) for s, k in chosen if len(s) <= MAX_SENTENCE_CHARS]


def _sentence_kinds_each(texts: Sequence[str]) -> list[list[tuple[str, Kind]]]:
    """For each text, its sentences that instruct, each with its kind, in order.

    A sentence's kind is the first kind (in section order) with a cue that starts a word in it,
    else "fact" for a statement word that starts a word in a sentence holding a value. The texts
    are read joined by newlines (no cue, statement word or sentence holds one, so none spans two
    texts): one scan in C over the whole finds the texts that hold any cue, one the statement
    words; only the texts they name are split into sentences and read kind by kind."""
    joined = "\n".join(texts)
    lowered = joined.lower()
    if len(lowered) != len(joined):  # a few letters lower to two ("İ"): offsets must hold
        lowered = "\n".join(map(_lowered, texts))
    bounds = list(accumulate([len(text) + 1 for text in texts], initial=0))
    scanned = "\n" + lowered  # each word after the character before it: offsets are the word's
    cued = {_text_at(bounds, m.start()) for m in _ANY_CUE.finditer(scanned)}
    cued.update(_text_at(bounds, m.start()) for m in _ANY_CJK_CUE.finditer(lowered))
    stated: dict[int, list[int]] = {}
    for at in [
        m.start() for m in _STATEMENT.finditer(scanned) if _starts_a_word(lowered, m.start())
    ]:
        stated.setdefault(_text_at(bounds, at), []).append(at)
    for at in [m.start() for m in _CJK_STATEMENT.finditer(lowered)]:
        stated.setdefault(_text_at(bounds, at), []).append(at)
    kinds: list[list[tuple[str, Kind]]] = [[] for _ in texts]
    for number in sorted(cued | stated.keys()):
        within = (bounds[number], bounds[number + 1] - 1)
        cues = _CUES if number in cued else {}
        kinds[number] = _kinds_in(joined, lowered, within, cues, stated.get(number, []))
    return kinds


def _kinds_in(
    joined: str,
    lowered: str,
    within: tuple[int, int],
    cues: dict[Kind, re.Pattern[str]],
    stated: list[int],
) -> list[tuple[str, Kind]]:
    """The sentences of one text (`within` the joined texts) that instruct, with their kinds,
    given the cues to look for in it and where its statement words start."""
    spans = [m.span() for m in _SENTENCE.finditer(joined, *within)]
    starts = [start for start, _ in spans]
    found: dict[int, Kind] = {}
    for kind, cue in cues.items():
        for at in [m.start() for m in cue.finditer(lowered, *within)]:
            if _starts_a_word(lowered, at):
                found.setdefault(bisect_right(starts, at) - 1, kind)  # the first kind wins
    for at in stated:
        holding = bisect_right(starts, at) - 1
        if holding not in found and _holds_a_value(joined, *spans[holding]):
            found[holding] = "fact"
    kinds: list[tuple[str, Kind]] = []
    for at in sorted(found):
        sentence = collapse_spaces(joined[slice(*spans[at])])
        if sentence.endswith("?"):
            continue  # a question lays nothing down
        label = _LABEL.match(sentence)
        kinds.append((sentence, _LABELS[label.group(1).casefold()] if label else found[at]))
    return kinds


def _holds_a_value(text: str, start: int, end: int) -> bool:
    if not (_DIGIT_OR_SLASH.search(text, start, end) or _CAPITALS.search(text, start, end)):
        return False
    return _VALUE.search(text, start, end) is not None


def _lowered(text: str) -> str:
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


def _text_at(bounds: list[int], offset: int) -> int:
    return bisect_right(bounds, offset) - 1


def _starts_a_word(text: str, at: int) -> bool:
    return at == 0 or not text[at].isascii() or not text[at - 1].isalnum()


def kind_of(sentence: str) -> Kind | None:
    """The kind a sentence is labelled with ("HARD CONSTRAINT: …"), else the first kind (in
    section order) whose cue it holds; None for a question or a sentence that lays nothing
    down."""
    kinds = _sentence_kinds_each([sentence])[0]
    return kinds[0][1] if kinds else None


def merge_instructions(
    earlier: Sequence[Instruction], later: Sequence[Instruction]
) -> list[Instruction]:
    """`earlier` then `later`, each statement once (the first telling kept), every statement
    superseded by the latest one after it that changes it."""
    merged: dict[str, Instruction] = {}
    for instruction in [*earlier, *later]:
        known = merged.get(instruction.identity)
        if known is not None and known.superseded and not instruction.superseded:
            del merged[instruction.identity]  # said again after a change: in force again
        merged.setdefault(instruction.identity, instruction)
    listed = list(merged.values())
    _mark_superseded(listed)
    return listed


def _mark_superseded(listed: list[Instruction]) -> None:
    """Marks in place each statement that a later one of its kind changes: both hold values,
    the values differ, and their subjects overlap by SUPERSEDING_OVERLAP or more.

    The pairs are looked up, not all tried (a long conversation gives thousands of statements),
    as set-similarity joins find them (AllPairs): taken from the smallest subject to the largest,
    each statement is filed under the first third or so of its words, in one order for all,
    rarest first, and compared only with those filed under one of its first half; two subjects
    that overlap that much (a threshold above 0) always share such a word. Which of a pair is
    marked is a matter of their order in `listed`, whatever the order they are met in."""
    stems: dict[str, str] = {}
    valued: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
    for at, instruction in enumerate(listed):
        if not instruction.superseded:
            values, subject = _values_and_subject(instruction.text, stems)
            if values:
                valued[at] = (values, subject)
    counts = Counter(word for _, subject in valued.values() for word in subject)
    filed: dict[tuple[Kind, str], list[int]] = {}
    for at in sorted(valued, key=lambda at: len(valued[at][1])):
        values, subject = valued[at]
        words = sorted(subject, key=lambda word: (counts[word], word))
        kinded = [(listed[at].kind, word) for word in words]
        probed = kinded[: len(words) - ceil(_OVERLAP * len(words)) + 1]
        for other in {other for key in probed for other in filed.get(key, ())}:
            older = min(other, at)
            other_values, other_subject = valued[other]
            if (
                not listed[older].superseded
                and other_values != values
                and _overlaps(other_subject, subject)
            ):
                listed[older] = replace(listed[older], superseded=True)
        for key in kinded[: len(words) - ceil(_FILED_OVERLAP * len(words)) + 1]:
            filed.setdefault(key, []).append(at)


def _values_and_subject(text: str, stems: dict[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """The values a statement holds, and the words it is about, its values left out ("capped"
    and "cap" alike); no subject when it holds no value."""
    if not (_DIGIT_OR_SLASH.search(text) or _CAPITALS.search(text)):
        return frozenset(), frozenset()
    found = list(_VALUE.finditer(text))
    if not found:
        return frozenset(), frozenset()
    values = frozenset(match.group().casefold() for match in found)
    ends = [0, *(match.end() for match in found)]
    starts = [*(match.start() for match in found), len(text)]
    rest = " ".join(text[end:start] for end, start in zip(ends, starts, strict=True))
    words = _SUBJECT_WORD.findall(rest.casefold())
    for word in words:
        if word not in stems:
            stems[word] = _stem(word)
    return values, frozenset(stems[word] for word in words if word not in _COMMON)


def _stem(word: str) -> str:
    if len(word) <= 4 or word.endswith(("eed", "ss")):
        return word
    return _DOUBLED.sub(r"\1", _STEM.sub("", word))


def _overlaps(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether `a` and `b` share SUPERSEDING_OVERLAP or more of their union (Jaccard)."""
    smaller, larger = sorted((len(a), len(b)))
    if smaller < SUPERSEDING_OVERLAP * larger:
        return False  # the smaller one cannot hold that much of the union
    shared = len(a & b)
    union = smaller + larger - shared
    return union > 0 and shared / union >= SUPERSEDING_OVERLAP


def ranked(instructions: Sequence[Instruction]) -> list[Instruction]:
    """In force first, by kind (rules first), each kind in the order said; superseded last."""
    # sorted is stable: within a kind, the order the user said them
    return sorted(instructions, key=lambda i: (i.superseded, KINDS.index(i.kind)))
