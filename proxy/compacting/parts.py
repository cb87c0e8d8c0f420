"""Forwarded lists spliced from the client's own bytes: kept items go out as the bytes the client
sent them as, only new items (a summary, Anthropic's joined turn) are serialized.

A remembered body (proxy.compacting.known) knows where its items are; `splice_view` finds them
for a body that is not remembered, so a conversation's forwarded prefix keeps its bytes whether
or not it is remembered (a client writing JSON unlike orjson keeps its prompt cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from proxy.compacting.spans import Items, locate_value, scan_items

Part = int | range | bytes
"""A piece of a spliced array: the index of an original item, a run of them, or the bytes of a
new one."""


def splice(body: bytes, open_at: int, items: Items, parts: Sequence[Part]) -> bytes:
    """`body` with the array at `open_at` replaced by `parts`; runs of consecutive original
    items are copied as one slice (separators included)."""
    pieces: list[bytes] = []
    run_start = run_end = -1  # the run of original items being gathered (inclusive)
    for part in parts:
        if isinstance(part, bytes):
            if run_start >= 0:
                pieces.append(body[items.starts[run_start] : items.ends[run_end]])
                run_start = run_end = -1
            pieces.append(part)
            continue
        first, last = (part, part) if isinstance(part, int) else (part.start, part.stop - 1)
        if last < first:
            continue  # an empty range
        if run_start >= 0 and first == run_end + 1:
            run_end = last
            continue
        if run_start >= 0:
            pieces.append(body[items.starts[run_start] : items.ends[run_end]])
        run_start, run_end = first, last
    if run_start >= 0:
        pieces.append(body[items.starts[run_start] : items.ends[run_end]])
    return b"".join((body[: open_at + 1], b",".join(pieces), body[items.close :]))


def splice_view(body: bytes, key: str, original: list[Any], view: Sequence[Any]) -> bytes | None:
    """`body` with its `key` array replaced by `view`, as a remembered body's splice does it (a
    prefix keeps its bytes once a conversation is remembered); None when it cannot be followed."""
    open_at = locate_value(body, orjson.dumps(key))
    items = scan_items(body, open_at) if open_at is not None else None
    if open_at is None or items is None or not original or len(items.starts) != len(original):
        return None
    if not is_same(body, items, original):
        return None
    return splice(body, open_at, items, view_parts(original, view))


def view_parts(original: Sequence[Any], view: Sequence[Any]) -> list[Part]:
    """The parts of a view of `original` (kept items are the same objects; others serialized)."""
    index = {id(item): i for i, item in enumerate(original)}
    parts: list[Part] = []
    for item in view:
        found = index.get(id(item))
        parts.append(found if found is not None else orjson.dumps(item))
    return parts


def is_same(body: bytes, items: Items, messages: list[Any]) -> bool:
    """Spot check that the scanned items are the parsed ones (first and last)."""
    for i in {0, len(messages) - 1}:
        try:
            if orjson.loads(body[items.starts[i] : items.ends[i]]) != messages[i]:
                return False
        except orjson.JSONDecodeError:
            return False
    return True
