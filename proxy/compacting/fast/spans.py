"""Where things are in a JSON request body, found by a byte-level scan (compiled regular
expressions; nothing is parsed): the value of a top-level key, and the items of an array.

Dialect-neutral: chat's `messages`, Responses' `input` and Anthropic's `messages` are all a JSON
array of items under a top-level key. The scan trusts a body that parses (callers parse what
they use); on bytes it cannot follow it returns None, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_PLAIN = rb'[^"{}\[\]]*'
# Anything up to the next bracket or brace outside a string (strings skipped whole).
_ATOM = _PLAIN + rb"(?:" + _STRING + _PLAIN + rb")*"
_FLAT_OBJECT = re.compile(rb"\{" + _ATOM + rb"\}")
_NEXT_BRACKET = re.compile(_ATOM + rb"([{}\[\]])")
_SEPARATOR = re.compile(rb"[ \t\r\n]*,?[ \t\r\n]*")
_KEY = re.compile(rb"[ \t\r\n]*(" + _STRING + rb")[ \t\r\n]*:[ \t\r\n]*")
_STRING_VALUE = re.compile(_STRING)
_SCALAR = re.compile(rb"[^,}\] \t\r\n]+")
_OPENERS = frozenset(b"{[")


@dataclass(frozen=True)
class Items:
    """The items of one array: item i is body[starts[i]:ends[i]]; `close` is the offset of the
    array's `]`."""

    starts: list[int]
    ends: list[int]
    close: int


def locate_value(body: bytes, key: bytes) -> int | None:
    """Offset of the first byte of top-level `key`'s value (`key` as raw JSON, with its quotes:
    b'"messages"'); None when the body is not an object holding that key."""
    start = body.find(b"{")
    if start < 0 or body[:start].strip():
        return None
    pos = start + 1
    while True:
        found = _KEY.match(body, pos)
        if found is None:
            return None
        pos = found.end()
        if found.group(1) == key:
            return pos
        end = _skip_value(body, pos)
        if end is None:
            return None
        pos = _SEPARATOR.match(body, end).end()  # type: ignore[union-attr]


def scan_items(body: bytes, open_at: int, *, first: int | None = None) -> Items | None:
    """The items of the array whose `[` is at `open_at`. With `first`, the scan starts there (an
    offset just after an item known to be one of the array's): the result then holds only the
    items after it. None when the bytes are not a well-formed array."""
    if body[open_at : open_at + 1] != b"[":
        return None
    starts: list[int] = []
    ends: list[int] = []
    pos = open_at + 1 if first is None else first
    size = len(body)
    while True:
        pos = _SEPARATOR.match(body, pos).end()  # type: ignore[union-attr]
        if pos >= size:
            return None
        if body[pos] == 0x5D:  # ]
            return Items(starts, ends, pos)
        end = _skip_value(body, pos)
        if end is None:
            return None
        starts.append(pos)
        ends.append(end)
        pos = end


def _skip_value(body: bytes, pos: int) -> int | None:
    """The offset just after the JSON value starting at `pos`."""
    if pos >= len(body):
        return None
    lead = body[pos]
    if lead == 0x7B:  # {: most items hold no nested object or array: one match
        flat = _FLAT_OBJECT.match(body, pos)
        if flat is not None:
            return flat.end()
    if lead in _OPENERS:
        depth = 0
        while True:
            bracket = _NEXT_BRACKET.match(body, pos)
            if bracket is None:
                return None
            pos = bracket.end()
            depth += 1 if bracket.group(1) in (b"{", b"[") else -1
            if depth == 0:
                return pos
    found = (_STRING_VALUE if lead == 0x22 else _SCALAR).match(body, pos)
    return found.end() if found is not None else None
