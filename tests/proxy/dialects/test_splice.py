"""Replacing one field of a JSON request in its original bytes: every other byte kept."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.splice import load_json, locate_field

NEW = b'[{"role":"user","content":"new"}]'


def splice(body: bytes, field: str = "messages") -> bytes | None:
    span = locate_field(body, orjson.loads(body), field)
    return None if span is None else span.replace(body, NEW)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (b'{"messages": ', b"}"),
        (b'{ "model" : "m",\n  "messages"  :\t', b"\n}\n"),
        (b'{"seed": 123456789012345678901234567890123, "messages":', b', "temperature": 1.50}'),
        (b'{"messages":', b',"tools":[{"type":"function"}],"x":{"messages":[]}}'),
        # the field's name appears earlier as a value and as a nested key
        (b'{"a": "messages", "b": {"messages": 1}, "messages": ', b', "n": 1E2}'),
        # the next key's name appears inside the value being replaced
        (b'{"messages": ', b', "model": "\\u00e9"}'),
    ],
)
def test_only_the_fields_value_changes(before: bytes, after: bytes) -> None:
    old = b'[{"role": "user", "content": "say \\"model\\""}, {"model": "tricky", "k": [1, {}]}]'
    assert splice(before + old + after) == before + NEW + after


def test_a_body_with_a_duplicated_field_is_not_placed() -> None:
    assert splice(b'{"messages": [1], "model": "m", "messages": [2]}') is None


def test_a_field_written_with_escapes_is_not_placed() -> None:
    assert splice(b'{"\\u006dessages": [1], "model": "m"}') is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(
    st.dictionaries(st.text(max_size=8), _JSON, max_size=4),
    st.dictionaries(st.text(max_size=8), _JSON, max_size=4),
    st.lists(_JSON, max_size=4),
)
def test_any_object_keeps_every_other_member_byte_for_byte(
    head: dict[str, object], tail: dict[str, object], messages: list[object]
) -> None:
    head.pop("messages", None)
    tail = {k: v for k, v in tail.items() if k not in head and k != "messages"}
    body = orjson.dumps({**head, "messages": messages, **tail})
    spliced = splice(body)
    assert spliced is not None
    assert orjson.loads(spliced) == {**head, "messages": orjson.loads(NEW), **tail}
    assert len(spliced) == len(body) - len(orjson.dumps(messages)) + len(NEW)


@pytest.mark.parametrize(
    ("text", "read"),
    [
        (rb'"\ud83d cut"', "\ufffd cut"),
        (rb'"\ude00\ud83d"', "\ufffd\ufffd"),
        (rb'"\ud83d\ud83d\ude00"', "\ufffd\U0001f600"),
        (rb'"\\ud83d"', "\\ud83d"),  # an escaped backslash, then text
        (rb'"\\\ud83d"', "\\\ufffd"),
        (b'\xef\xbb\xbf{"n": 1e400}', {"n": float("inf")}),
        # As orjson reads them: integers beyond 64 bits as floats (none it could not write).
        (
            b"[1e400, 18446744073709551615, 18446744073709551616, -9223372036854775809]",
            [float("inf"), 2**64 - 1, float(2**64), float(-(2**63) - 1)],
        ),
        (b"[1" + b"0" * 400 + b", -" + b"9" * 5000 + b"]", [float("inf"), float("-inf")]),
    ],
)
def test_what_orjson_refuses_is_read_into_values_orjson_can_write(
    text: bytes, read: object
) -> None:
    assert load_json(text) == read


def test_a_body_that_is_not_unicode_is_not_read() -> None:
    with pytest.raises(ValueError):
        load_json(b'{"n": 1e400, "s": "\xed\xa0\xbd"}')  # a surrogate in raw bytes
