"""Which conversation a request belongs to, read from its body (DESIGN §5, after the header and
the path): the session its client already names, else what a fingerprint reads of its opening.

Clients that know their conversations say so in every request: the Responses API's
`prompt_cache_key` and Codex's `client_metadata` (`session_id`, or since 0.17x the `thread_id` in
its `x-codex-turn-metadata`), Claude Code's `metadata.user_id` (a
JSON string holding `session_id`; older versions `..._session_<uuid>`), the gateways'
`metadata.session_id`. Such a name is the client's, not the operator's: it becomes an id of the
session-id alphabet scoped by the caller's credentials (two tenants naming the same session never
share its records or its memory file), and it never names a path.

A fingerprint must be the same for every request of one conversation and differ between two: it
leaves out the per-request markers (`cache_control`, which Claude Code puts on the newest turn
only) and the context the client injects into user turns (Codex's `<environment_context>` and
AGENTS.md blocks, Claude Code's `<system-reminder>`...), which is the same for every
conversation started in one folder on one day. The list of those elements is the library's
(`compaction.strip_injected`), which reads user turns through it too: never taken for the task.

Cost on the request path: a few dictionary reads of fields already parsed, one hash of the name
(and for Codex and Claude Code one parse of a string of 200-800 bytes): microseconds, whatever the size
of the body.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson

from compaction import strip_injected

# Keys of a content part that differ between requests of one conversation.
_MARKERS = frozenset({"cache_control"})

_OUT_OF_ALPHABET = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_CHARS = 96  # leaves room for the scope digest within the 128 of a session id
_MAX_NAME_CHARS = 1024  # longer is no session name
_MAX_JSON_CHARS = 8192  # a client's metadata string; anything longer is not read
_CODEX_TURN = "x-codex-turn-metadata"
_CLAUDE_CODE_SESSION = re.compile(r"_session_([A-Za-z0-9-]{1,128})$")


def named_session(payload: Mapping[str, Any], tenant: bytes) -> str | None:
    """The session id for the conversation the client names in `payload`, scoped by `tenant`
    (the digest of the caller's credentials); None when the client names none."""
    name = _client_name(payload)
    if name is None:
        return None
    digest = hashlib.sha256(tenant + b"\x00" + name.encode()).hexdigest()[:16]
    readable = _OUT_OF_ALPHABET.sub("_", name).lstrip(".")[:_NAME_CHARS]
    return f"{readable}-{digest}" if readable else f"named-{digest}"


def _client_name(payload: Mapping[str, Any]) -> str | None:
    """The first name the client gives its conversation: the specific fields before the
    generic `prompt_cache_key` (which a client may share between conversations)."""
    client = payload.get("client_metadata")
    if isinstance(client, Mapping):
        if _is_name(name := client.get("session_id")):
            return name
        turn = client.get(_CODEX_TURN)
        if isinstance(turn, str) and (name := _codex_thread(turn)) is not None:
            return name
    metadata = payload.get("metadata")
    if isinstance(metadata, Mapping):
        if _is_name(name := metadata.get("session_id")):
            return name
        user = metadata.get("user_id")
        if isinstance(user, str) and (name := _claude_code_session(user)) is not None:
            return name
    key = payload.get("prompt_cache_key")
    return key if _is_name(key) else None


def _codex_thread(turn: str) -> str | None:
    """The thread in Codex's turn metadata (a JSON object as a string): each thread is one
    conversation (a sub-agent's too), `session_id` the whole run's."""
    fields = _json_object(turn)
    for key in ("thread_id", "session_id"):
        if _is_name(name := fields.get(key)):
            return name
    return None


def _json_object(text: str) -> dict[str, Any]:
    if len(text) > _MAX_JSON_CHARS or not text.startswith("{"):
        return {}
    try:
        fields = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return fields if isinstance(fields, dict) else {}


def _claude_code_session(user_id: str) -> str | None:
    """The `session_id` in Claude Code's `metadata.user_id`: a JSON object as a string, or in
    older versions `user_<hash>_account_<uuid>_session_<uuid>`."""
    if user_id.startswith("{"):
        name = _json_object(user_id).get("session_id")
        return name if _is_name(name) else None
    found = _CLAUDE_CODE_SESSION.search(user_id)
    return found.group(1) if found else None


def _is_name(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip()) and len(value) <= _MAX_NAME_CHARS


# -- what a fingerprint reads ----------------------------------------------------------------


def is_injected(content: Any) -> bool:
    """True for a user turn's content that holds only what the client injected (no words of
    the person's own)."""
    return user_words(content) is None


def user_words(content: Any) -> Any:
    """A user turn's `content` as a fingerprint reads it: injected elements and per-request
    markers left out (a part left empty is dropped); None when nothing of the person's is left.
    Content the rule does not know (an image part) is kept as it is, markers aside."""
    if isinstance(content, str):
        said = strip_injected(content).strip()
        return said or None
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if not isinstance(part, Mapping):
            parts.append(part)
            continue
        text = part.get("text")
        if isinstance(text, str):
            words = strip_injected(text).strip()
            if not words:
                continue
            part = {**part, "text": words}
        elif part.get("type") == "tool_result":  # an Anthropic tool loop's turn: not the person's
            continue
        parts.append({key: value for key, value in part.items() if key not in _MARKERS})
    return parts or None


def without_markers(content: Any) -> Any:
    """`content` (a head message's, a system prompt) without per-request markers."""
    if not isinstance(content, list):
        return content
    return [
        {k: v for k, v in part.items() if k not in _MARKERS} if isinstance(part, Mapping) else part
        for part in content
    ]
