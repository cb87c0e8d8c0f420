"""A request's payload as every dialect reads and writes it: the JSON object a body must be
(`NotCompactable` otherwise), the list field the dialect compacts and what the dialects do alike
(`ItemsDialect`), its other fields read as ints or tool names, the body with one field replaced,
and a user turn's words as a fingerprint reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from compaction import Message, strip_injected
from proxy.dialects.base import JsonObject, NativeCompaction, NotCompactable
from proxy.dialects.splice import load_json, locate_field
from proxy.errors import openai_error_body


def load_object(body: bytes) -> JsonObject:
    try:
        payload = load_json(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parsers' depth
        raise NotCompactable("body is not JSON") from exc
    if not isinstance(payload, dict):
        raise NotCompactable("body is not a JSON object")
    return payload


class ItemsDialect:
    """What every dialect does alike: a body is a JSON object whose `items_key` holds the list,
    the list goes upstream as it is, `usage` sits at a response's top level, a message's tool
    calls are in its content, the OpenAI-shaped upstream lists the models, and the proxy's own
    errors take OpenAI's shape. A dialect overrides what differs."""

    items_key: str
    lists_models = True
    usage_holder: str | None = None

    def calls_outside_content(self, message: Mapping[str, object]) -> object:
        return None

    def error_body(self, status: int, message: str, type_: str, code: str | None) -> bytes:
        return openai_error_body(message, type_, code)

    def parse(self, body: bytes) -> tuple[JsonObject, list[Message]]:
        payload = load_object(body)
        return payload, self.items(payload)

    def items(self, payload: Mapping[str, object]) -> list[Message]:
        return list_field(payload, self.items_key)

    def wire(self, messages: list[Message]) -> list[Message]:
        return messages

    has_thinking = False
    native: NativeCompaction | None = None

    def reasoning_room(self, payload: Mapping[str, object]) -> int:
        return 0

    def refuses_bound_thinking(self, status: int, body: bytes) -> bool:
        return False

    def without_thinking(self, message: Message) -> Message | None:
        return None


def list_field(payload: Mapping[str, object], name: str) -> list[Message]:
    value = payload.get(name)
    if not isinstance(value, list):
        raise NotCompactable(f"body has no {name} list")
    return value


def replace_field(body: bytes, payload: Mapping[str, object], name: str, value: object) -> bytes:
    """`body` (which `payload` was parsed from) with field `name` replaced by `value`: every
    other byte as sent (proxy.dialects.splice), or, for a body it cannot place the field in
    with certainty, the payload re-serialized."""
    span = locate_field(body, payload, name)
    if span is not None:
        return span.replace(body, orjson.dumps(value))
    return orjson.dumps({**payload, name: value})


def positive_int(payload: Mapping[str, object], *keys: str) -> int | None:
    """The first of `keys` holding a positive integer."""
    for key in keys:
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def int_field(usage: Mapping[str, object], key: str) -> int | None:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tool_names(payload: Mapping[str, object]) -> list[str]:
    """Sorted names of the request's tools: `name`, or `function.name` (chat completions)."""
    tools = payload.get("tools")
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool.get("name")
        if isinstance(name, str):
            names.append(name)
    return sorted(names)


def declared_names(payload: Mapping[str, object]) -> list[str]:
    """The names of every function the request declares: its tools (`tool_names`) and chat's
    legacy `functions`, which a fingerprint does not read (sessions named before stay so)."""
    functions = payload.get("functions")
    legacy = [
        name
        for function in (functions if isinstance(functions, list) else [])
        if isinstance(function, Mapping) and isinstance(name := function.get("name"), str)
    ]
    return [*tool_names(payload), *legacy]


def first_user_words(messages: Iterable[object]) -> object:
    """The first user turn's words of the person (`user_words`): turns holding only what the
    client injected are passed over; None when there is none yet."""
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            words = user_words(message.get("content"))
            if words is not None:
                return words
    return None


# -- what a fingerprint reads ----------------------------------------------------------------
#
# A fingerprint must be the same for every request of one conversation and differ between two:
# it leaves out the per-request markers (`cache_control`, which Claude Code puts on the newest
# turn only) and the context the client injects into user turns (Codex's `<environment_context>`
# and AGENTS.md blocks, Claude Code's `<system-reminder>`...), which is the same for every
# conversation started in one folder on one day. The list of those elements is the library's
# (`compaction.strip_injected`), which reads user turns through it too: never taken for the task.

# Keys of a content part that differ between requests of one conversation.
_MARKERS = frozenset({"cache_control"})


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
