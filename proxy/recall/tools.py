"""The `recall` tool (its name, description and parameters; each dialect declares it in its own
shape), and a compacted request equipped with it.

The tool's bytes are fixed (one JSON text per dialect, built once): appended after the client's
own tools, they keep the forwarded `tools` array byte-stable from one request to the next, so
upstream prompt caches keep hitting. The summary message gains one line saying the folded turns
can be recalled (its text is the library's, compaction.recall_note). Equipping works on the
forwarded bytes with C-speed searches; a body it cannot place with certainty goes out as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from compaction import PREVIEW_MARK, SUMMARY_MARKER, recall_note
from proxy.dialects import Dialect, declared_names
from proxy.dialects.splice import locate_field

NAME = "recall"

DESCRIPTION = (
    "Get back, word for word, earlier turns of this conversation that were condensed into the "
    "summary to fit the context window: what the user or you wrote, tools' outputs (file "
    "contents, command output, errors) and remembered facts, decisions, preferences and todos. "
    "Call it whenever you need an exact detail the summary does not give (a number, a name, a "
    "path, a value, a quote) instead of guessing. Results come best match first, each saying "
    "which turn it came from."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "A few key words of what to find (names, identifiers, distinctive "
            "terms), not a whole question.",
        },
        "kind": {
            "type": "string",
            "enum": ["message", "tool_output", "memory"],
            "description": "Only this kind: message (what the user or assistant wrote), "
            "tool_output (a tool's result), memory (a remembered fact, decision, preference or "
            "todo). Omit to search all.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": 20,
            "description": "How many results at most (default 5).",
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}


_TOOL_BYTES: dict[str, bytes] = {}


def tool_bytes(dialect: Dialect) -> bytes:
    """The tool as `dialect` declares it, serialized once: the same bytes on every request."""
    serialized = _TOOL_BYTES.get(dialect.name)
    if serialized is None:
        serialized = _TOOL_BYTES[dialect.name] = orjson.dumps(
            dialect.tool(NAME, DESCRIPTION, PARAMETERS)
        )
    return serialized


# How far past the summary marker the framing's line about tools may lie.
_FRAMING_SPAN = 4096


def has_own_recall(payload: Mapping[str, object]) -> bool:
    """True when the client declares a tool named `recall` itself (in `tools`, or in chat's
    legacy `functions`): then the proxy neither adds its own nor answers any call to it."""
    return NAME in declared_names(payload)


def added_text(dialect: Dialect) -> str:
    """What equipping adds to a request of `dialect`: the tool and the summary's line."""
    return tool_bytes(dialect).decode() + recall_note()[1]


def equip(body: bytes, payload: Mapping[str, object], dialect: Dialect) -> bytes | None:
    """The compacted request `body` (its fields, list aside, those of `payload`, in order) with
    the recall tool after the client's tools and the recall line in its summary; None when
    either cannot be placed with certainty (the body then goes out unequipped). A request whose
    compaction only cut tool outputs to previews has no summary: the previews themselves say
    the whole can be recalled, and the tool goes out alone."""
    tool = tool_bytes(dialect)
    noted = _with_note(body)
    if noted is None:
        if _PREVIEW_BYTES not in body:
            return None
        noted = body
    return _with_tool(noted, payload, tool)


_PREVIEW_BYTES = orjson.dumps(PREVIEW_MARK)[1:-1]


def _with_note(body: bytes) -> bytes | None:
    marker = orjson.dumps(SUMMARY_MARKER)[1:-1]
    start = body.find(marker)
    if start < 0:
        return None
    anchor, line = (orjson.dumps(text)[1:-1] for text in recall_note())
    at = body.find(anchor, start, start + _FRAMING_SPAN)
    if at < 0:
        return None
    at += len(anchor)
    return b"".join((body[:at], line, body[at:]))


def _with_tool(body: bytes, payload: Mapping[str, object], tool: bytes) -> bytes | None:
    tools = payload.get("tools")
    if "tools" not in payload:
        close = body.rstrip().rfind(b"}")
        if close < 0:
            return None
        opened = body[:close].rstrip()
        comma = b"" if opened.endswith(b"{") else b","
        return b"".join((opened, comma, b'"tools":[', tool, b"]", body[close:]))
    span = locate_field(body, payload, "tools")
    if span is None:
        return None
    value = body[span.start : span.end]
    if tools is None:
        return span.replace(body, b"[" + tool + b"]")
    if not isinstance(tools, list) or not value.endswith(b"]"):
        return None
    inner = value[:-1].rstrip()
    comma = b"," if tools else b""
    return span.replace(body, b"".join((inner, comma, tool, b"]")))
