"""Forwarded lists spliced from the client's own bytes: kept items go out as the bytes the client
sent them as, only new items (a summary, Anthropic's joined turn) are serialized.

A remembered body (proxy.compacting.fast.indexes) knows where its items are; `splice_view` finds them
for a body that is not remembered, so a conversation's forwarded prefix keeps its bytes whether
or not it is remembered (a client writing JSON unlike orjson keeps its prompt cache).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import orjson

from compaction import Message
from proxy.compacting.decision.request import Payload
from proxy.compacting.fast.spans import Items, locate_value, scan_items
from proxy.dialects.splice import load_json

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


def splice_view(
    body: bytes, key: str, original: list[Message], view: Sequence[Message]
) -> bytes | None:
    """`body` with its `key` array replaced by `view`, as a remembered body's splice does it (a
    prefix keeps its bytes once a conversation is remembered); None when it cannot be followed."""
    open_at = locate_value(body, orjson.dumps(key))
    items = scan_items(body, open_at) if open_at is not None else None
    if open_at is None or items is None or not original or len(items.starts) != len(original):
        return None
    if not is_same(body, items, original) or other_fields(body, open_at, items.close, key) is None:
        return None
    return splice(body, open_at, items, view_parts(original, view))


# What the list is replaced by to parse the other members: found back under the list's key, it
# proves the list located is the member a parser keeps (a second member of that name after it,
# perhaps with its key written with escapes, would win: the upstream would read that one). Drawn
# per process: a body cannot hold it, as the value of such a second member that would pass.
_PLACEHOLDER = orjson.dumps(f"\x00compaction-proxy: the list {secrets.token_hex(16)}\x00")
_PLACEHOLDER_VALUE = orjson.loads(_PLACEHOLDER)


def other_fields(body: bytes, open_at: int, close: int, key: str) -> Payload | None:
    """The members of the object `body` besides its `key` array (at `open_at`, its `]` at
    `close`), parsed, `key` holding an empty list; None when that array is not the `key` a
    parser keeps, or the rest is not a JSON object."""
    try:
        fields = orjson.loads(body[:open_at] + _PLACEHOLDER + body[close + 1 :])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(fields, dict) or fields.get(key) != _PLACEHOLDER_VALUE:
        return None
    fields[key] = []
    return fields


def view_parts(original: Sequence[Message], view: Sequence[Message]) -> list[Part]:
    """The parts of a view of `original` (kept items are the same objects; others serialized)."""
    # Built in C: a long history holds hundreds of thousands of items.
    index = dict(zip(map(id, original), range(len(original)), strict=True))
    parts: list[Part] = []
    for item in view:
        found = index.get(id(item))
        parts.append(found if found is not None else orjson.dumps(item))
    return parts


def is_same(body: bytes, items: Items, messages: list[Message]) -> bool:
    """Spot check that the scanned items are the parsed ones (first and last)."""
    for i in {0, len(messages) - 1}:
        try:
            if load_json(body[items.starts[i] : items.ends[i]]) != messages[i]:
                return False
        except ValueError:
            return False
    return True
