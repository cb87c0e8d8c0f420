"""Session identity (DESIGN §5): `X-Session-Id`, then the `/s/{session}/` path, then a
fingerprint of the conversation's opening.

Ids become directory names under `memory.dir`, so they are validated strictly here: the
pattern leaves no room for separators, and a leading dot is refused (no `.`, `..`, hidden dirs).
`fingerprint()` takes an already-parsed body: the pass-through path never parses one just to
name its session.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from compaction.memory import is_valid_session_id
from proxy.errors import InvalidSessionId

SESSION_HEADER = "X-Session-Id"
_HEAD_ROLES = ("system", "developer")


def check_session_id(value: str, source: str) -> str:
    """`value` if it is a valid id; InvalidSessionId (400) naming `source` otherwise."""
    if not is_valid_session_id(value):
        raise InvalidSessionId(
            f"invalid session id in {source}: use 1-128 characters from [A-Za-z0-9._-], "
            "not starting with a dot"
        )
    return value


def resolve_session_id(headers: Mapping[str, str], path_session: str | None) -> str | None:
    """The explicit session id of a request (header first, then path), validated; None if the
    request names none. Both are checked when both are present: a bad id is a bad request."""
    header = headers.get(SESSION_HEADER)
    if path_session is not None:
        check_session_id(path_session, "the path")
    if header is not None:
        return check_session_id(header, f"the {SESSION_HEADER} header")
    return path_session


def fingerprint(payload: Mapping[str, Any]) -> str:
    """A stable session id for a chat request that names none: a digest of the conversation's
    opening (the head system/developer messages, the tool names and the first user message).

    The first user message is part of it because the system prompt alone is the same for every
    conversation of one agent."""
    messages = payload.get("messages")
    messages = messages if isinstance(messages, list) else []
    first_user = next(
        (m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"),
        None,
    )
    opening = {"head": _head_contents(messages), "tools": _tool_names(payload), "user": first_user}
    try:
        canonical = orjson.dumps(opening, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits from a lenient parser
        canonical = repr(opening).encode()
    return f"fp-{hashlib.sha256(canonical).hexdigest()[:32]}"


def _head_contents(messages: list[Any]) -> list[Any]:
    head = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") in _HEAD_ROLES:
            head.append(message.get("content"))
        else:
            break
    return head


def _tool_names(payload: Mapping[str, Any]) -> list[str]:
    tools = payload.get("tools")
    names = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            names.append(name)
    return sorted(names)
