"""The names clients give their conversations in a request's body, as each dialect reads them
(proxy.compacting.decision.identity scopes a name into a session id).

Clients that know their conversations say so in every request: Codex's `client_metadata`
(`session_id`, or since 0.17x the `thread_id` in its `x-codex-turn-metadata`), Claude Code's
`metadata.user_id` (a JSON string holding `session_id`; older versions `..._session_<uuid>`),
the gateways' `metadata.session_id`, the OpenAI APIs' `prompt_cache_key`. A dialect reads the
fields its API carries, the specific ones before the generic `prompt_cache_key` (which a client
may share between conversations).

Cost on the request path: a few dictionary reads of fields already parsed (and for Codex and
Claude Code one parse of a string of 200-800 bytes): microseconds, whatever the size of the body.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import orjson

NameReader = Callable[[Mapping[str, object]], "str | None"]
"""One field a client may name its conversation in."""

_MAX_NAME_CHARS = 1024  # longer is no session name
_MAX_JSON_CHARS = 8192  # a client's metadata string; anything longer is not read
_CODEX_TURN = "x-codex-turn-metadata"
_CLAUDE_CODE_SESSION = re.compile(r"_session_([A-Za-z0-9-]{1,128})$")


def first_name(payload: Mapping[str, object], readers: tuple[NameReader, ...]) -> str | None:
    """The name the first of `readers` finds in `payload`."""
    for reader in readers:
        name = reader(payload)
        if name is not None:
            return name
    return None


def codex_session(payload: Mapping[str, object]) -> str | None:
    """Codex's `client_metadata`: its `session_id`, or the thread in its turn metadata."""
    client = payload.get("client_metadata")
    if not isinstance(client, Mapping):
        return None
    if _is_name(name := client.get("session_id")):
        return name
    turn = client.get(_CODEX_TURN)
    return _codex_thread(turn) if isinstance(turn, str) else None


def gateway_session(payload: Mapping[str, object]) -> str | None:
    """`metadata.session_id`, as gateways name a conversation."""
    metadata = payload.get("metadata")
    name = metadata.get("session_id") if isinstance(metadata, Mapping) else None
    return name if _is_name(name) else None


def claude_code_session(payload: Mapping[str, object]) -> str | None:
    """The `session_id` in Claude Code's `metadata.user_id`: a JSON object as a string, or in
    older versions `user_<hash>_account_<uuid>_session_<uuid>`."""
    metadata = payload.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        name = _json_object(user_id).get("session_id")
        return name if _is_name(name) else None
    found = _CLAUDE_CODE_SESSION.search(user_id)
    return found.group(1) if found else None


def cache_key_session(payload: Mapping[str, object]) -> str | None:
    """The OpenAI APIs' `prompt_cache_key`."""
    key = payload.get("prompt_cache_key")
    return key if _is_name(key) else None


OPENAI_NAMES: tuple[NameReader, ...] = (
    codex_session,
    gateway_session,
    claude_code_session,
    cache_key_session,
)
"""Where an OpenAI-shaped request (chat or Responses) names its conversation, first match wins:
clients send these fields to both APIs alike."""


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


def _is_name(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip()) and len(value) <= _MAX_NAME_CHARS
