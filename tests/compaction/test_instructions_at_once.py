"""find_instructions reads all the user's texts at once, and merge_instructions looks up the
pairs that may supersede one another instead of trying every pair: both give what the
definitions below give (each text read on its own with one scan per cue, every earlier statement
compared with every later one), as the two were first written.
"""

from __future__ import annotations

import re
import string
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from compaction.instructions import (
    SUPERSEDING_OVERLAP,
    Instruction,
    Kind,
    find_instructions,
    kind_of,
    merge_instructions,
)
from compaction.messages import Item, read_items
from compaction.scan import strip_fences
from compaction.text import collapse_spaces

# ------------------------------------------------------------------ the definitions


def _cues(words: str, cjk: str = "") -> re.Pattern[str]:
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


def _defined_find(items: Sequence[Item]) -> list[Instruction]:
    found: list[Instruction] = []
    for item in items:
        if item.is_request:
            found += _defined_instructions_in(item.text)
    return found


def _defined_instructions_in(text: str) -> list[Instruction]:
    said = _TAGGED.sub(" ", strip_fences(text)) if "<" in text or "```" in text else text
    chosen = [(s, k) for s, k in _defined_sentence_kinds(said) if len(s) >= 8]
    if not chosen:
        return []
    whole = collapse_spaces(said)
    if len(whole) <= 400:
        return [Instruction(chosen[0][1], whole)]
    return [Instruction(k, s) for s, k in chosen if len(s) <= 400]


def _defined_sentence_kinds(text: str) -> list[tuple[str, Kind]]:
    spans = [m.span() for m in _SENTENCE.finditer(text)]
    starts = [start for start, _ in spans]
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = text.translate(_ASCII_LOWER)

    def hit(pattern: re.Pattern[str]) -> set[int]:
        at = [m.start() for m in pattern.finditer(lowered)]
        return {
            bisect_right(starts, i) - 1
            for i in at
            if i == 0 or not lowered[i].isascii() or not lowered[i - 1].isalnum()
        }

    found: dict[int, Kind] = {}
    for kind, cue in _CUES.items():
        for at in hit(cue):
            found.setdefault(at, kind)
    for at in hit(_STATEMENT) - found.keys():
        if _VALUE.search(text, *spans[at]):
            found[at] = "fact"
    kinds: list[tuple[str, Kind]] = []
    for at in sorted(found):
        sentence = collapse_spaces(text[slice(*spans[at])])
        if sentence.endswith("?"):
            continue
        label = _LABEL.match(sentence)
        kinds.append((sentence, _LABELS[label.group(1).casefold()] if label else found[at]))
    return kinds


def _defined_merge(
    earlier: Sequence[Instruction], later: Sequence[Instruction]
) -> list[Instruction]:
    merged: dict[str, Instruction] = {}
    for instruction in [*earlier, *later]:
        known = merged.get(instruction.identity)
        if known is not None and known.superseded and not instruction.superseded:
            del merged[instruction.identity]
        merged.setdefault(instruction.identity, instruction)
    listed = list(merged.values())
    subjects = [_defined_subject(i.text) for i in listed]
    values = [frozenset(v.casefold() for v in _VALUE.findall(i.text)) for i in listed]
    for at, newer in enumerate(listed):
        if newer.superseded:
            continue
        for before in range(at):
            older = listed[before]
            union = subjects[before] | subjects[at]
            overlap = len(subjects[before] & subjects[at]) / len(union) if union else 0.0
            if (
                not older.superseded
                and older.kind == newer.kind
                and values[before]
                and values[at]
                and values[before] != values[at]
                and overlap >= SUPERSEDING_OVERLAP
            ):
                listed[before] = replace(older, superseded=True)
    return listed


def _defined_subject(text: str) -> frozenset[str]:
    words = _SUBJECT_WORD.findall(_VALUE.sub(" ", text).casefold())
    return frozenset(_defined_stem(w) for w in words if w not in _COMMON)


def _defined_stem(word: str) -> str:
    if len(word) <= 4 or word.endswith(("eed", "ss")):
        return word
    return _DOUBLED.sub(r"\1", _STEM.sub("", word))


# ------------------------------------------------------------------ the tests


def _requests(texts: Sequence[str]) -> list[Item]:
    return read_items([{"role": "user", "content": text} for text in texts])


def test_every_corpus_request_gives_what_the_definition_gives(corpus_items: list[Item]) -> None:
    requests = [item for item in corpus_items if item.is_request]
    found = find_instructions(requests)
    assert found == _defined_find(requests)
    assert len(found) > 1000  # the corpus lays down plenty: the comparison means something
    half = len(found) // 3
    assert merge_instructions(found[:half], found[half:]) == _defined_merge(
        found[:half], found[half:]
    )


EDGES = [
    "Never delete data/.",  # a cue that opens the text
    "x\nnever use sudo",  # after a newline
    '_never run it. (never) run it. "never" run it. -never run it.',
    "énever run it here.",  # after a letter outside ASCII: no word starts there
    "Undo not allowed here.",  # a cue inside a word hides the one after it
    "The value prefixed at most 3 times.",
    "The İstanbul office: never ship on Friday. Budget cap is $500.",  # lowers to two letters
    "我们用 Redis. 这是 eu-west-3. 总是用中文回答.",
    "The host is db-7.internal. Our host is db-8.internal!",
    "This is 5. His car is Red Car. Mel is in Paris. Is it 4?",
    "Rules: keep it short. HARD CONSTRAINT: cap is $300. fyi the key is K-9.",
    "Phase 2 starts now. We are working on phase 3. The task is ABC-12 now.",
    "See https://x.io/a. The path is src/app.py. Codename is KESTREL-7.",
    "Only admins may deploy. only the lead can merge. Only one of us is allowed to.",
    "",
    "。。never. ! ? ...must not...",
    "a.b.c must. e.g.x never!!y. 3.11 is the version",
    "<note>never</note> but always <b>x</b>. ```\nnever\n``` we decided on 3.",
]


def test_edge_texts_give_what_the_definition_gives() -> None:
    items = _requests(EDGES)
    assert find_instructions(items) == _defined_find(items)
    for text in EDGES:  # each alone, so that neither side leans on its neighbours
        assert find_instructions(_requests([text])) == _defined_find(_requests([text]))
        assert kind_of(text) == next(iter(k for _, k in _defined_sentence_kinds(text)), None)


_PIECES = [
    *("never", "must not", "do not", "undo", "at most", "fixed at", "prefixed", "only we may"),
    *("we decided", "i prefer", "the task is", "phase 4", "note:", "rules:", "is", "are"),
    *("this", "called", "Mel", "Paris", "$500", "v2", "src/a.py", "AB-12", "http://h.io/x"),
    *("总是", "是", "在", "İ", "é", "_", "-", "(", "\n", ". ", "! ", "? ", ".", "。", "```"),
    *("<x>", "</x>", " ", " ", " ", "budget", "cap", "capped", "exceeds", "style"),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join), max_size=6))
def test_generated_texts_give_what_the_definition_gives(texts: list[str]) -> None:
    items = _requests(texts)
    assert find_instructions(items) == _defined_find(items)


_KINDS: list[Kind] = ["rule", "constraint", "fact"]
_WORDS = ["budget", "cap", "capped", "release", "codename", "server", "host", "deploy", "the"]
_VALUES = ["$300", "$500", "KESTREL-7", "v2", "eu-west-3", "Paris"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_KINDS),
            st.lists(st.sampled_from(_WORDS), min_size=0, max_size=5),
            st.lists(st.sampled_from(_VALUES), max_size=2),
            st.booleans(),
        ),
        max_size=25,
    ),
    st.integers(min_value=0, max_value=25),
)
def test_generated_merges_give_what_the_definition_gives(
    said: list[tuple[Kind, list[str], list[str], bool]], split: int
) -> None:
    instructions = [
        Instruction(kind, " ".join([*words, "is", *values]) + ".", superseded=superseded)
        for kind, words, values, superseded in said
    ]
    earlier, later = instructions[:split], instructions[split:]
    assert merge_instructions(earlier, later) == _defined_merge(earlier, later)
