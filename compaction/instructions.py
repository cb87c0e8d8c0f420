"""Standing instructions: what the user said that holds until the user says otherwise.

Every statement in a user turn that lays down a rule, a constraint, a decision, a preference, a
goal or a fact the work depends on is kept verbatim (whitespace collapsed) as an `Instruction`.
The summary carries them in a pinned section of their own (pinned.py), ranked by kind (rules
first), never by recency; a statement made twice is kept once; a later statement about the same
subject with other values supersedes the earlier one, and both stay visible as such.

Found by cue words, one compiled expression per kind over each user text: no model is asked.
"""

from __future__ import annotations

import re
import string
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
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


def _cues(words: str, cjk: str = "") -> re.Pattern[str]:
    """Phrases (expressions over lowercased text) that end where a word ends, and CJK ones.

    No leading `\\b`: a pattern that opens with an assertion is tried at every position, one
    that opens with letters lets the engine skip to them; where a hit starts is checked on the
    few hits (`_starts_a_word`)."""
    return re.compile(f"(?:{words})(?!\\w)" + (f"|{cjk}" if cjk else ""))


_CUES: dict[Kind, re.Pattern[str]] = {
    "rule": _cues(
        r"(?:safety )?rules?:|never|always|must(?:n't| not)?|do not|don't|shall not"
        r"|under no circumstances|not allowed|forbidden|prohibited|make sure|from now on"
        r"|at all times|without (?:explicit |prior )?(?:approval|consent|permission)",
        "禁止|不要|不许|必须|务必|永远不|总是",
    ),
    "constraint": _cues(
        r"(?:hard )?constraints?:|limits?:|caps?|capped|limit(?:ed)?|at most|at least"
        r"|no more than|maximum|minimum|exceed\w*|budget|deadline|due (?:on|by)"
        r"|only \w+(?: \w+)? (?:may|can|is allowed)|fixed at|does not move|no later than",
        "上限|预算|截止|最多|不超过",
    ),
    "decision": _cues(
        r"decisions?:|decided|we decide|let's go with|let's use|we'll use|we will use"
        r"|going with|agreed|we chose|settled on",
        "决定|就用|我们用",
    ),
    "preference": _cues(
        r"(?:user )?preferences?:|i(?:'d| would)? prefer|prefers?|i like|i want|wants"
        r"|please (?:always|never|use|avoid|keep|answer|write|reply)|rather than|instead of"
        r"|style",
        "偏好|喜欢|请用",
    ),
    "goal": _cues(
        r"goals?(?: state)?:|goal is|aim is|objective|next step|next up|the task is"
        r"|current task|we are (?:working|in phase)|milestone|phase \d",
        "目标|下一步",
    ),
    "fact": _cues(r"facts?:|notes?:|fyi"),
}
# A fact without a label: a statement ("is", "runs", "lives"…) holding a specific value.
_STATEMENT = _cues(
    r"is|are|was|were|runs|lives|belongs|hosted|located|based|uses|called|named", "是|在"
)
_VALUE = re.compile(
    r"\$?\d[\w./:-]*|https?://\S+|\b[\w.-]+/[\w./-]+|\b[A-Z][A-Z0-9]*-[A-Z0-9-]+\b"
    r"|(?<=\w )[A-Z][a-z]+(?: [A-Z][a-z]+)*"
)
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
_SENTENCE = re.compile(r"(?:[^.!?。！？\n]|[.!?](?![\s]|\Z))+[.!?。！？]*")
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
    found: list[Instruction] = []
    for item in items:
        if item.is_request:
            found += _instructions_in(item.text)
    return found


def _instructions_in(text: str) -> list[Instruction]:
    said = _TAGGED.sub(" ", strip_fences(text)) if "<" in text or "```" in text else text
    chosen = [(s, k) for s, k in _sentence_kinds(said) if len(s) >= MIN_SENTENCE_CHARS]
    if not chosen:
        return []
    whole = collapse_spaces(said)
    if len(whole) <= WHOLE_MESSAGE_CHARS:
        return [Instruction(chosen[0][1], whole)]
    return [Instruction(k, s) for s, k in chosen if len(s) <= MAX_SENTENCE_CHARS]


def _sentence_kinds(text: str) -> list[tuple[str, Kind]]:
    """The sentences of `text` that instruct, each with its kind, in order.

    Each cue runs once over the whole text (in C) and its hits go to their sentences by
    bisection: a long pasted text costs a few scans, not a few scans per sentence."""
    spans = [m.span() for m in _SENTENCE.finditer(text)]
    starts = [start for start, _ in spans]
    lowered = text.lower()
    if len(lowered) != len(text):  # a few letters lower to two ("İ"): offsets must hold
        lowered = text.translate(_ASCII_LOWER)

    def hit(pattern: re.Pattern[str]) -> set[int]:
        at = [m.start() for m in pattern.finditer(lowered)]
        return {bisect_right(starts, i) - 1 for i in at if _starts_a_word(lowered, i)}

    found: dict[int, Kind] = {}
    for kind, cue in _CUES.items():
        for at in hit(cue):
            found.setdefault(at, kind)  # the first kind in section order wins
    for at in hit(_STATEMENT) - found.keys():
        if _VALUE.search(text, *spans[at]):
            found[at] = "fact"
    kinds: list[tuple[str, Kind]] = []
    for at in sorted(found):
        sentence = collapse_spaces(text[slice(*spans[at])])
        if sentence.endswith("?"):
            continue  # a question lays nothing down
        label = _LABEL.match(sentence)
        kinds.append((sentence, _LABELS[label.group(1).casefold()] if label else found[at]))
    return kinds


def _starts_a_word(text: str, at: int) -> bool:
    return at == 0 or not text[at].isascii() or not text[at - 1].isalnum()


def kind_of(sentence: str) -> Kind | None:
    """The kind a sentence is labelled with ("HARD CONSTRAINT: …"), else the first kind (in
    section order) whose cue it holds; None for a question or a sentence that lays nothing
    down."""
    kinds = _sentence_kinds(sentence)
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
    subjects = [_subject(i.text) for i in listed]
    values = [_values(i.text) for i in listed]
    for at, newer in enumerate(listed):
        if newer.superseded:
            continue
        for before in range(at):
            older = listed[before]
            if (
                not older.superseded
                and older.kind == newer.kind
                and values[before]
                and values[at]
                and values[before] != values[at]
                and _overlap(subjects[before], subjects[at]) >= SUPERSEDING_OVERLAP
            ):
                listed[before] = replace(older, superseded=True)
    return listed


def _subject(text: str) -> frozenset[str]:
    """The words a statement is about, its values left out ("capped" and "cap" alike)."""
    words = _SUBJECT_WORD.findall(_VALUE.sub(" ", text).casefold())
    return frozenset(_stem(w) for w in words if w not in _COMMON)


def _stem(word: str) -> str:
    if len(word) <= 4 or word.endswith(("eed", "ss")):
        return word
    return _DOUBLED.sub(r"\1", _STEM.sub("", word))


def _values(text: str) -> frozenset[str]:
    return frozenset(v.casefold() for v in _VALUE.findall(text))


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def ranked(instructions: Sequence[Instruction]) -> list[Instruction]:
    """In force first, by kind (rules first), each kind in the order said; superseded last."""
    # sorted is stable: within a kind, the order the user said them
    return sorted(instructions, key=lambda i: (i.superseded, KINDS.index(i.kind)))
