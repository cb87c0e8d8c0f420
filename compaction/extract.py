"""Memory items from folded messages: parsed from the model's answer, or guessed by keywords.

The model's answer is a JSON array of {type, content} objects, possibly fenced or wrapped in
prose. Without a usable answer, keyword heuristics pick preferences, decisions and todos from
what the user and assistant wrote (tool output is never mined).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from compaction.messages import Item
from compaction.scan import strip_fences
from compaction.text import collapse_spaces, split_sentences
from compaction.types import MEMORY_TYPES, MemoryItem, as_memory_type

MAX_CONTENT_CHARS = 1000

_FENCE_LINE = re.compile(r"^\s*```[\w-]*\s*$", re.MULTILINE)


# ---------------------------------------------------------------- parsing the LLM's answer


def parse_memory_reply(text: str) -> list[MemoryItem] | None:
    """The items of the first JSON array in `text`; None when there is no array at all.

    Code fences and prose around the array are ignored; items that are not objects with a known
    `type` and a non-empty string `content` are dropped.
    """
    found = _first_json_array(_FENCE_LINE.sub("", text))
    if found is None:
        return None
    items: list[MemoryItem] = []
    for entry in found:
        item = _memory_item(entry)
        if item is not None and item not in items:
            items.append(item)
    return items


def extract_memory_items(
    reply_text: str | None, folded: Iterable[Item]
) -> tuple[list[MemoryItem], str | None]:
    """The items of the model's answer, else (no answer, no array, or no valid item in it) items
    guessed from `folded`; and the error, if the model answered without a JSON array."""
    parsed = parse_memory_reply(reply_text) if reply_text is not None else None
    if parsed:
        return parsed, None
    # An empty list, or one with no valid {type, content} object, says nothing the folded
    # messages cannot: code mines them instead of writing nothing.
    error = None
    if reply_text is not None and parsed is None:
        error = "memory call failed: no JSON array in the answer"
    return extract_items_heuristically(folded), error


def _first_json_array(text: str) -> list[Any] | None:
    """The first JSON array holding an object (prose like "see [1]" is skipped), else the first
    array of any kind, else None."""
    decoder = json.JSONDecoder()
    first: list[Any] | None = None
    start = text.find("[")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list):
            if any(isinstance(entry, dict) for entry in value):
                return value
            first = value if first is None else first
        start = text.find("[", start + 1)
    return first


def _memory_item(entry: Any) -> MemoryItem | None:
    if not isinstance(entry, dict):
        return None
    kind = entry.get("type")
    content = entry.get("content")
    if not isinstance(kind, str) or not isinstance(content, str):
        return None
    kind = kind.strip().lower()
    content = collapse_spaces(content)[:MAX_CONTENT_CHARS]
    if kind not in MEMORY_TYPES or not content:
        return None
    return MemoryItem(as_memory_type(kind), content)


# ---------------------------------------------------------------- extraction without an LLM

# Preferences are directives about how to work ("please always", "don't use"), not small talk
# ("I always loved painting"); todos come from the user or an explicit TODO, never from the
# assistant thinking aloud ("THOUGHT: I need to look at…").
_PREFERENCE = re.compile(
    r"\b(?:i(?:'d| would)? prefer|please (?:always|never|don't|do not|use|avoid|keep)"
    r"|(?:don't|do not|never) use|avoid using|from now on|make sure (?:to|you))\b"
    r"|偏好|总是要|不要用|别用|请用",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:decided|we decide|let's go with|let's use|we'll use|we will use|going with|agreed)\b"
    r"|决定|就用|我们用",
    re.IGNORECASE,
)
_USER_TODO = re.compile(
    r"\bTODO\b|(?i:\bnext step\b|\bstill have to\b|\bremember to\b)|待办|下一步"
)
_EXPLICIT_TODO = re.compile(r"\bTODO\b|待办")
MAX_HEURISTIC_ITEMS = 30
MAX_HEURISTIC_CHARS = 300


def extract_items_heuristically(items: Iterable[Item]) -> list[MemoryItem]:
    """Items guessed from keywords in what the user and assistant wrote (no tool output).

    Preferences come only from the user; decisions from either side; todos from the user, or
    marked TODO. One sentence, one item; at most MAX_HEURISTIC_ITEMS.
    """
    found: list[MemoryItem] = []
    for item in items:
        if not item.is_prose:
            continue
        for sentence in _sentences(item.text):
            memory_item = _classify(sentence, item.is_request)
            if memory_item is not None and memory_item not in found:
                found.append(memory_item)
            if len(found) >= MAX_HEURISTIC_ITEMS:
                return found
    return found


def _sentences(text: str) -> list[str]:
    prose = strip_fences(text)
    return [s for s in split_sentences(prose) if 6 <= len(s) <= MAX_HEURISTIC_CHARS]


def _classify(sentence: str, from_user: bool) -> MemoryItem | None:
    if from_user and _PREFERENCE.search(sentence):
        return MemoryItem("preference", sentence)
    if _DECISION.search(sentence):
        return MemoryItem("decision", sentence)
    if (_USER_TODO if from_user else _EXPLICIT_TODO).search(sentence):
        return MemoryItem("todo", sentence)
    return None
