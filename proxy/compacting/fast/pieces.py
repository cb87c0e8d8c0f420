"""A large request body parsed in pieces, the event loop serving other requests in between.

orjson parses 50 MiB in about 170 ms without letting go of the GIL: every other request waits
that long, whichever thread parses (a thread is worse for mid-sized bodies: while it runs, each
of the loop's wake-ups waits up to the GIL's 5 ms switch interval). Parsed a megabyte at a time
(the body's list cut between two of its items, each piece parsed as an array of its own; the
other members in one call without the list, as parts.other_fields reads them), the parse is a
run of calls of about 3 ms, and the loop runs whatever is ready between two of them
(`by_pieces` awaits between pieces; `parse_steps` is the same parse as a generator). It costs
what the whole parse costs, give or take a copy.

The pieces make the whole by construction: each piece parses as the items of an array, at the
depth the body holds them (orjson refuses what is nested past 1024 levels), between two pieces
there is one comma, the last piece (the list's last item, once less than a piece is left) ends
where the list does and the list is the member a parser keeps; then the body parses, and to the
same value. A body where the cuts cannot be found or
checked is not read here (None) and is parsed whole, so a body is read the same way either way,
and one that is not JSON is refused the same way.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Generator

import orjson

from compaction import Message
from proxy.compacting.decision.request import Payload
from proxy.compacting.fast.parts import other_fields
from proxy.compacting.fast.spans import locate_value, scan_items
from proxy.dialects import Dialect

PIECES_FROM_BYTES = 1 << 20
"""Bodies from this size on are parsed in pieces (a whole parse of a megabyte holds the loop
about 3 ms)."""

_PIECE_BYTES = 1 << 20
_MAX_PIECE_BYTES = 16 << 20
"""A piece that does not parse is grown to twice its length (to the next cut after that), up to
this size: grown a cut at a time, an item no piece parses (a lone surrogate) would have every
longer piece holding it parsed again, half a minute at 8 MiB."""

# Between two items of the list: one object's end, a comma, and the next object, whose first
# member is "role" (chat's and Anthropic's messages) or the "type" of a Responses item (as Codex
# writes them: a message, a reasoning, a call or its output; never a content part's type). A
# quote right after the brace is not inside a string (there it is escaped) nor closes one (a
# name follows it), so a cut never falls in a string; it may fall between two objects nested in
# one item, and the piece before it then does not parse.
_BETWEEN_ITEMS = re.compile(
    rb'\}[ \t\r\n]*,[ \t\r\n]*(?=\{[ \t\r\n]*"(?:role"|type"[ \t\r\n]*:[ \t\r\n]*'
    rb'"(?:message|reasoning|[a-z_]+_call(?:_output)?)"))'
)


async def parse_in_pieces(dialect: Dialect, body: bytes) -> tuple[Payload, list[Message]]:
    """`body` parsed by `dialect` (its payload and its list; NotCompactable as the dialect
    raises it), in pieces when it is large: the same request either way."""
    pieces = None
    if len(body) >= PIECES_FROM_BYTES:
        pieces = await by_pieces(body, dialect.items_key)
    if pieces is None:
        return dialect.parse(body)
    return pieces, dialect.items(pieces)


async def by_pieces(
    body: bytes, items_key: str, *, piece_bytes: int = _PIECE_BYTES
) -> Payload | None:
    """The JSON object `body` parsed, as orjson parses it whole, with the list under `items_key`
    parsed in pieces, other tasks running between two; None when the body is not an object
    holding such a list, a piece does not parse (a number beyond a double, say) or the cuts
    cannot be found (then the whole parse decides)."""
    steps = parse_steps(body, items_key, piece_bytes=piece_bytes)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            parsed: Payload | None = done.value
            return parsed
        await asyncio.sleep(0)


def parse_steps(
    body: bytes, items_key: str, *, piece_bytes: int = _PIECE_BYTES
) -> Generator[None, None, Payload | None]:
    """`by_pieces` as a generator: it yields after each piece and returns the parsed object."""
    open_at = locate_value(body, orjson.dumps(items_key))
    if open_at is None or body[open_at : open_at + 1] != b"[":
        return None
    view = memoryview(body)
    items: list[Message] = []
    start = open_at + 1
    reach = start + piece_bytes
    last_tried = False
    while True:
        cut = _BETWEEN_ITEMS.search(body, reach)
        if cut is None and not last_tried:  # less than a piece left: all but its last item
            last_tried = True
            cut = _last_cut(body, start, reach)
        if cut is None:
            break
        piece = _array(view[start : cut.start() + 1])
        yield
        if piece is None:  # cut between objects nested in an item, or not JSON
            if cut.end() - start > _MAX_PIECE_BYTES:
                return None
            reach = start + 2 * (cut.end() - start)
            continue
        items += piece
        start = cut.end()  # the next item's `{`
        reach = start + piece_bytes
    # The last piece, the last item (or the items no cut could part), runs to the list's `]`,
    # found by scanning its items: a Python step each, ~6 ms for the last 0.7 MiB of prose.
    rest = scan_items(body, open_at, first=start)
    last = _array(view[start : rest.close]) if rest is not None else None
    if rest is None or last is None:
        return None
    fields = other_fields(body, open_at, rest.close, items_key)
    if fields is None:
        return None
    fields[items_key] = items + last
    return fields


def _last_cut(body: bytes, start: int, reach: int) -> re.Match[bytes] | None:
    """The last cut between `start` and `reach` (the caller found none past it)."""
    last = None
    for last in _BETWEEN_ITEMS.finditer(body, start, reach):  # noqa: B007 (the last one kept)
        pass
    return last


def _array(piece: memoryview) -> list[Message] | None:
    """The items `piece` holds, parsed as the array "[" + piece + "]"; None if it is not one.
    Parsed as deep as the body holds them (in an array in an object): orjson refuses what is
    nested past 1024 levels, and one level less deep a piece would read what the body does not."""
    try:
        parsed = orjson.loads(b"".join((b"[[", piece, b"]]")))
    except orjson.JSONDecodeError:
        return None
    return parsed[0] if len(parsed) == 1 else None  # a piece holding "], [" makes two
