"""The byte-level scan of a JSON body: items of an array, and a top-level key's value."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.compacting.fast.spans import locate_value, scan_items

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(alphabet=st.sampled_from('ab "\\{}[],:\n\té中🙂'), max_size=12)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
_layouts = st.sampled_from(
    [
        {"separators": (",", ":")},
        {"separators": (", ", ": ")},
        {"indent": 2},
        {"ensure_ascii": False},
    ]
)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(_values, max_size=6), layout=_layouts)
def test_scanned_items_are_exactly_the_array_items(
    items: list[Any], layout: dict[str, Any]
) -> None:
    body = json.dumps({"model": "m", "messages": items}, **layout).encode()
    open_at = locate_value(body, b'"messages"')
    assert open_at is not None
    found = scan_items(body, open_at)
    assert found is not None
    assert [json.loads(body[s:e]) for s, e in zip(found.starts, found.ends, strict=True)] == items
    assert body[found.close : found.close + 1] == b"]"


@settings(max_examples=100, deadline=None)
@given(items=st.lists(_values, min_size=1, max_size=6), more=st.lists(_values, max_size=4))
def test_a_scan_can_start_after_a_known_item(items: list[Any], more: list[Any]) -> None:
    body = json.dumps({"messages": items + more}).encode()
    open_at = locate_value(body, b'"messages"')
    assert open_at is not None
    whole = scan_items(body, open_at)
    assert whole is not None
    rest = scan_items(body, open_at, first=whole.ends[len(items) - 1])
    assert rest is not None
    assert [json.loads(body[s:e]) for s, e in zip(rest.starts, rest.ends, strict=True)] == more


def test_a_nested_key_of_the_same_name_is_not_the_top_level_one() -> None:
    body = b'{"tools": [{"messages": [1, 2]}], "note": "\\"messages\\": [3]", "messages": [4]}'
    open_at = locate_value(body, b'"messages"')
    assert open_at is not None
    assert body[open_at:] == b"[4]}"


def test_bodies_that_cannot_be_followed_give_none() -> None:
    assert locate_value(b'["messages"]', b'"messages"') is None
    assert locate_value(b'{"model": "m"}', b'"messages"') is None
    assert scan_items(b'{"messages": [{"a": 1}', 13) is None
    assert scan_items(b'{"messages": 5}', 13) is None
