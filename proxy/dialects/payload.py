"""A request's payload as every dialect reads and writes it: the JSON object a body must be
(`NotCompactable` otherwise), the list field the dialect compacts (`ItemsDialect`), its other
fields read as ints or tool names, and the body with one field replaced."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from compaction import Message
from proxy.compacting.identity import user_words
from proxy.compacting.splice import load_json, locate_field
from proxy.dialects.base import JsonObject, NotCompactable


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
    and the list goes upstream as it is. A dialect overrides what differs."""

    items_key: str

    def parse(self, body: bytes) -> tuple[JsonObject, list[Message]]:
        payload = load_object(body)
        return payload, self.items(payload)

    def items(self, payload: Mapping[str, object]) -> list[Message]:
        return list_field(payload, self.items_key)

    def wire(self, messages: list[Message]) -> list[Message]:
        return messages


def list_field(payload: Mapping[str, object], name: str) -> list[Message]:
    value = payload.get(name)
    if not isinstance(value, list):
        raise NotCompactable(f"body has no {name} list")
    return value


def replace_field(body: bytes, payload: Mapping[str, object], name: str, value: object) -> bytes:
    """`body` (which `payload` was parsed from) with field `name` replaced by `value`: every
    other byte as sent (proxy.compacting.splice), or, for a body it cannot place the field in
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


def first_user_words(messages: Iterable[object]) -> object:
    """The first user turn's words of the person (proxy.compacting.identity.user_words): turns
    holding only what the client injected are passed over; None when there is none yet."""
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            words = user_words(message.get("content"))
            if words is not None:
                return words
    return None
