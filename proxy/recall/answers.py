"""What a call to `recall` gets back: the session's archived turns and memory items that match
its query best (proxy.state.archive.search_session), in the scope of the request's own session and
credential only, as one text clipped to the room left in the window, each result saying which
turn it came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import orjson

from proxy.state.archive import Archive, Found, Kind, search_session
from proxy.state.archive.terms import query_terms

DEFAULT_LIMIT = 5
MAX_LIMIT = 20
# A result's characters per token, counted low (code and CJK run below English's four).
CHARS_PER_TOKEN = 3
# At most this many tokens per answer, however much room the window has.
MAX_ANSWER_TOKENS = 8000
# A query is a few key words: past this many characters it is clipped, in the search and in the
# answer that repeats it (a 1.2 MB query echoed whole doubled the next round's request).
MAX_QUERY_CHARS = 300
_KINDS: tuple[str, ...] = get_args(Kind)
_CLIPPED = "\n[... clipped to fit the context window]"
_GAP = "[...]"
# Below this many characters of room, a result is not cut to an excerpt: it is left out.
_LEAST_EXCERPT = 80
# Lines kept on each side of a line that holds a query word, when a result is cut to excerpts.
_CONTEXT_LINES = 1


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
        text.strip()[:MAX_QUERY_CHARS],
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
    """The results as one text, best first, within `room_tokens`. A result too long for the room
    it has left is cut to the lines that hold the query's words (with a line either side), so an
    answer deep in a long tool output still reaches the model."""
    if not found:
        return f"Nothing earlier matches {query.text!r}. Try other key words, or go on without it."
    room = max(0, min(room_tokens, MAX_ANSWER_TOKENS)) * CHARS_PER_TOKEN
    terms = query_terms(query.text)
    header = f"{len(found)} earlier result(s) for {query.text!r}, best match first:"
    shown: list[str] = []
    used = len(header) + len(" (20 shown, the rest did not fit)")  # the longer header's room
    for number, item in enumerate(found, 1):
        head = f"\n\n[{number}] {_origin(item)}:\n"
        text = item.text.strip()
        left = room - used - len(head)
        if len(text) > left:
            if left - len(_CLIPPED) <= _LEAST_EXCERPT:
                break  # no room left for a useful piece of it
            # Cut to the lines holding the query's words: however short, that is an answer.
            text = excerpt(text, terms, left - len(_CLIPPED)) + _CLIPPED
        shown.append(head + text)
        used += len(head) + len(text)
    if not shown:
        # Never a header alone: the model is told what happened and what to do instead.
        return (
            f"{len(found)} earlier result(s) match {query.text!r}, but none fits in the room "
            "left in the context window. Ask again with fewer, more precise key words (a name, "
            "a path, a value), or go on without it."
        )
    if len(shown) < len(found):
        header = (
            f"{len(found)} earlier result(s) for {query.text!r}, best match first "
            f"({len(shown)} shown, the rest did not fit):"
        )
    return header + "".join(shown)


def excerpt(text: str, terms: list[str], budget: int) -> str:
    """At most `budget` characters of `text`: its lines that hold the most query words first (a
    line either side of each for context), in their order in the text, `[...]` where lines were
    left out; the text's start when no line holds a query word."""
    if budget <= 0:
        return ""
    lines = text.split("\n")
    lowered = [line.lower() for line in lines]
    scores = [sum(term in line for term in terms) for line in lowered]
    if not any(scores):
        return text[:budget]
    kept: set[int] = set()
    size = 0
    for best in sorted(range(len(lines)), key=lambda i: (-scores[i], i)):
        if not scores[best]:
            break
        window = range(max(0, best - _CONTEXT_LINES), min(len(lines), best + _CONTEXT_LINES + 1))
        added = [i for i in window if i not in kept]
        cost = sum(len(lines[i]) + len(_GAP) + 2 for i in added)
        if size + cost > budget:
            if not kept:  # one line longer than the room: its part around the first word found
                return _around(lines[best], terms, budget)
            continue
        kept.update(added)
        size += cost
    pieces: list[str] = []
    previous = -1
    for i in sorted(kept):
        if i != previous + 1:
            pieces.append(_GAP)
        pieces.append(lines[i])
        previous = i
    return "\n".join(pieces)[:budget]


def _around(line: str, terms: list[str], budget: int) -> str:
    lowered = line.lower()
    at = min((lowered.find(term) for term in terms if term in lowered), default=0)
    start = max(0, at - budget // 4)
    return line[start : start + budget]


def _origin(item: Found) -> str:
    if item.kind == "memory":
        return "memory item"
    what = "tool output" if item.kind == "tool_output" else "message"
    return f"turn {item.index}, {what}"
