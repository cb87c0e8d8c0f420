"""Splicing a forwarded list from the client's bytes (proxy.compacting.fast.parts): single indices,
runs given as ranges and new items in any mix give the bytes of the list serialized whole."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.compacting.fast.parts import Part, splice
from proxy.compacting.fast.spans import locate_value, scan_items

ITEMS: list[Any] = [{"role": "user", "content": f"m{i}", "n": [i, {"k": i}]} for i in range(8)]
NEW = {"role": "user", "content": "summary"}


def expected(indices: list[int | dict[str, Any]]) -> bytes:
    view = [ITEMS[i] if isinstance(i, int) else i for i in indices]
    return orjson.dumps({"model": "m", "messages": view, "stream": True})


@pytest.mark.parametrize(
    ("parts", "view"),
    [
        ([range(0, 2), orjson.dumps(NEW), 5, range(6, 8)], [0, 1, NEW, 5, 6, 7]),
        ([range(0), orjson.dumps(NEW), range(3, 8)], [NEW, 3, 4, 5, 6, 7]),
        ([0, 1, range(2, 4), 4, 7], [0, 1, 2, 3, 4, 7]),
        ([orjson.dumps(NEW), 2, range(5, 5), 3, orjson.dumps(NEW)], [NEW, 2, 3, NEW]),
    ],
)
def test_parts_splice_into_the_bytes_of_the_whole_list(parts: list[Part], view: list[Any]) -> None:
    body = orjson.dumps({"model": "m", "messages": ITEMS, "stream": True})
    open_at = locate_value(body, b'"messages"')
    assert open_at is not None
    items = scan_items(body, open_at)
    assert items is not None
    assert splice(body, open_at, items, parts) == expected(view)
