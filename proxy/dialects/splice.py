"""Replacing one top-level field of a JSON request in its original bytes.

A compacted request changes one field (`messages`; Responses' `input`, Anthropic's `messages`);
every other byte goes out as the client sent it. Re-serializing the parsed payload would not keep
that promise: a JSON parser normalizes numbers (an integer beyond 64 bits becomes a float, `1.50`
becomes `1.5`), escapes and spacing. So the field's value is located once in the original bytes
and only that span is replaced.

Locating is done with C-speed searches (`bytes.find`) and checked by parsing what lies before and
after the span (small: the other fields), never by walking the body byte by byte in Python. A body
this cannot place with certainty (a key written with escapes, duplicate keys) gives None, and the
caller re-serializes instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

_SPACE = re.compile(rb"[ \t\r\n]*")
_SPACE_CHARS = b" \t\r\n"
# How many occurrences of a key's text are tried before giving up (a key's name may also appear
# as a string value or a nested key; each false one costs a parse of the other fields).
_MAX_CANDIDATES = 16
# The integers orjson reads and writes as integers (see load_json).
_MIN_INT, _MAX_INT = -(2**63), 2**64 - 1
# What a JSON string's lone surrogate escape starts with (see load_json), and the escapes read to
# find one: an escaped backslash, a surrogate pair or a lone surrogate, matched left to right so
# that an escaped backslash is never read as the start of an escape.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPE = re.compile(
    r"\\\\"
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    r"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)


@dataclass(frozen=True)
class FieldSpan:
    """The bytes `body[start:end]` are the value of one top-level field."""

    start: int
    end: int

    def replace(self, body: bytes, value: bytes) -> bytes:
        """`body` with the field's value replaced by `value` (serialized JSON)."""
        return b"".join((body[: self.start], value, body[self.end :]))


def locate_field(body: bytes, payload: Mapping[str, Any], field: str) -> FieldSpan | None:
    """Where the value of top-level `field` lies in `body`, the JSON object `payload` was parsed
    from (keys in document order); None when it cannot be placed with certainty."""
    keys = list(payload)
    if field not in payload:
        return None
    index = keys.index(field)
    start = _value_start(body, field, keys[:index])
    if start is None:
        return None
    if index == len(keys) - 1:
        close = _end_before_space(body, len(body)) - 1
        if body[close : close + 1] != b"}":
            return None
        return FieldSpan(start, _end_before_space(body, close))
    end = _value_end(body, start, keys[index + 1 :])
    return FieldSpan(start, end) if end is not None else None


def _value_start(body: bytes, field: str, keys_before: list[str]) -> int | None:
    needle = orjson.dumps(field)
    position = body.find(needle)
    for _ in range(_MAX_CANDIDATES):
        if position < 0:
            return None
        colon = _SPACE.match(body, position + len(needle))
        assert colon is not None  # `*` always matches
        if body[colon.end() : colon.end() + 1] == b":" and _opens_object_with(
            body[:position], keys_before
        ):
            value = _SPACE.match(body, colon.end() + 1)
            assert value is not None
            return value.end()
        position = body.find(needle, position + 1)
    return None


def _value_end(body: bytes, start: int, keys_after: list[str]) -> int | None:
    # Searched from the end: the fields after the value are usually small, the value (the
    # conversation) large, and the first top-level candidate met from the end is the right one.
    needle = orjson.dumps(keys_after[0])
    position = body.rfind(needle, start)
    for _ in range(_MAX_CANDIDATES):
        if position < 0:
            return None
        comma = _end_before_space(body, position) - 1
        if body[comma : comma + 1] == b"," and _closes_object_with(body[comma + 1 :], keys_after):
            return _end_before_space(body, comma)
        position = body.rfind(needle, start, position)
    return None


def _opens_object_with(prefix: bytes, keys: list[str]) -> bool:
    """True when `prefix` is `{`, then exactly the members `keys`, then a comma: the key that
    follows is a top-level one."""
    head = prefix.rstrip(_SPACE_CHARS)
    if not keys:
        return head == b"{"
    if not head.endswith(b","):
        return False
    return _keys_of(head[:-1] + b"}") == keys


def _closes_object_with(suffix: bytes, keys: list[str]) -> bool:
    """True when `suffix` is exactly the members `keys` and the closing brace: the comma before
    it sits at the top level (one inside the field's value would leave brackets unbalanced)."""
    return _keys_of(b"{" + suffix) == keys


def _keys_of(text: bytes) -> list[str] | None:
    try:
        parsed = load_json(text)
    except ValueError:
        return None
    return list(parsed) if isinstance(parsed, dict) else None


def load_json(text: bytes) -> Any:
    """`text` parsed by orjson, or by the standard library when orjson refuses it: a number it
    cannot hold (an integer or exponent beyond a double), a lone surrogate escape (a string cut
    inside a UTF-16 pair, as JavaScript's JSON.stringify writes it). A request that is valid
    JSON is read, into values orjson can write again (the payload is hashed, counted and parts
    of it sent): a lone surrogate as U+FFFD, an integer beyond 64 bits as a float, as orjson
    reads one. Raises ValueError for what is not JSON (or not Unicode). (What is read here
    never goes upstream in place of the original bytes, see locate_field and
    proxy.compacting.fast.parts.)"""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        # Decoded strictly: json.loads would let raw surrogate bytes through.
        decoded = text.decode(json.detect_encoding(text))
        if _SURROGATE_ESCAPE.search(decoded):
            decoded = _ESCAPE.sub(_without_lone_surrogate, decoded)
        return json.loads(decoded, parse_int=_integer)


def _integer(text: str) -> int | float:
    """An integer as orjson reads it: beyond 64 bits, a float (infinite beyond a double). Only
    a short one is made an int: Python refuses to read one of more than 4300 digits."""
    if len(text) <= 20:  # 20 digits, or a sign and 19
        value = int(text)
        if _MIN_INT <= value <= _MAX_INT:
            return value
    return float(text)


def _without_lone_surrogate(escape: re.Match[str]) -> str:
    return "\\ufffd" if len(escape.group()) == 6 else escape.group()


def _end_before_space(body: bytes, end: int) -> int:
    """`end` moved back over the whitespace before it."""
    while end > 0 and body[end - 1] in _SPACE_CHARS:
        end -= 1
    return end
