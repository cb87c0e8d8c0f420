"""What a call to `recall` gets back: the session's archived turns and memory items that match
its query best (proxy.archive.search_session), in the scope of the request's own session and
credential only, as one text clipped to the room left in the window, each result saying which
turn it came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import orjson

from proxy.archive import Archive, Found, Kind, search_session

DEFAULT_LIMIT = 5
MAX_LIMIT = 20
# A result's characters per token, counted low (code and CJK run below English's four).
CHARS_PER_TOKEN = 3
# At most this many tokens per answer, however much room the window has.
MAX_ANSWER_TOKENS = 8000
_KINDS: tuple[str, ...] = get_args(Kind)
_CLIPPED = "\n[... clipped to fit the context window]"


@dataclass(frozen=True)
class Query:
    text: str
    kind: Kind | None
    limit: int


def read_query(arguments: object) -> Query | None:
    """The call's arguments (a JSON text in chat and Responses, an object in Anthropic) as a
    query; None when they name no query."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    text = arguments.get("query")
    if not isinstance(text, str) or not text.strip():
        return None
    kind = arguments.get("kind")
    limit = arguments.get("limit")
    return Query(
        text.strip(),
        kind if kind in _KINDS else None,
        min(limit, MAX_LIMIT) if isinstance(limit, int) and limit > 0 else DEFAULT_LIMIT,
    )


@dataclass(frozen=True)
class Answers:
    """Answers for one session and credential (`tenant`, the digest that scopes the archive):
    nothing of another session or credential is ever found."""

    archive: Archive
    memory_dir: Path
    session: str
    tenant: str

    async def answer(self, arguments: object, room_tokens: int) -> str:
        """The tool result for a call with `arguments`, at most `room_tokens` long."""
        query = read_query(arguments)
        if query is None:
            return 'recall needs a "query": a few key words of what to find.'
        wanted = query.limit * 4 if query.kind is not None else query.limit
        try:
            found = await search_session(
                self.archive,
                self.memory_dir,
                self.session,
                query.text,
                tenant=self.tenant,
                limit=wanted,
            )
        except Exception:  # an archive down: the model hears it, the request goes on
            return "recall is unavailable right now; go on with what you have."
        if query.kind is not None:
            found = [item for item in found if item.kind == query.kind]
        return render(query, found[: query.limit], room_tokens)


def render(query: Query, found: list[Found], room_tokens: int) -> str:
    """The results as one text, best first, clipped to `room_tokens`."""
    if not found:
        return f"Nothing earlier matches {query.text!r}. Try other key words, or go on without it."
    room = max(0, min(room_tokens, MAX_ANSWER_TOKENS)) * CHARS_PER_TOKEN
    parts = [f"{len(found)} earlier result(s) for {query.text!r}, best match first:"]
    used = len(parts[0])
    for number, item in enumerate(found, 1):
        part = f"\n\n[{number}] {_origin(item)}:\n{item.text.strip()}"
        if used + len(part) > room:
            left = room - used - len(_CLIPPED)
            if left > 80:
                parts.append(part[:left] + _CLIPPED)
            break
        parts.append(part)
        used += len(part)
    return "".join(parts)


def _origin(item: Found) -> str:
    if item.kind == "memory":
        return "memory item"
    what = "tool output" if item.kind == "tool_output" else "message"
    return f"turn {item.index}, {what}"
