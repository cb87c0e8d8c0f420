"""The chat-completions message shape: roles, `tool_calls`, `tool_call_id`, content strings and
part arrays, `name`, and the legacy `function_call` / `role: function` pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compaction.marker import is_summary_text
from compaction.messages.item import (
    AUDIO_PART_TOKENS,
    IMAGE_HIGH_TOKENS,
    IMAGE_LOW_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    TOOL_CALL_OVERHEAD_TOKENS,
    Item,
    Shape,
    ToolCall,
    file_data_tokens,
    is_observation_text,
    is_user_summary,
    json_text,
    user_item,
    user_summary,
)
from compaction.types import Message

LEGACY_CALL_PREFIX = "function_call:"
"""The id a legacy `function_call` gets, so its `role: function` answer pairs with it by name."""

_HEAD_ROLES = frozenset({"system", "developer"})


def is_message(item: object) -> bool:
    """True for a dict with a string role: the only chat item the library looks inside."""
    return isinstance(item, dict) and isinstance(item.get("role"), str)


def message_text(message: object) -> str:
    """The readable text of a message's content: strings, text parts, placeholders for media."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif isinstance(part.get("type"), str):
            pieces.append(f"[{part['type']}]")
    return "\n".join(pieces)


_item = tuple.__new__
"""An Item from all its fields in order, as `Item(...)` builds it less its keyword handling:
for the user and assistant messages that most of a history is made of."""


class ChatShape:
    """The chat-completions message shape."""

    def read(self, raw: Any) -> Item:
        role = raw.get("role") if isinstance(raw, dict) else None
        if not isinstance(role, str):
            return Item("other", repr(raw))
        # Read once per message of every plan: the content looked up once, and the usual
        # string content taken as it is.
        content = raw.get("content")
        text = content if isinstance(content, str) else message_text(raw)
        if role == "user":
            if text is not content:  # parts: neither a summary nor an observation
                return user_item(text, role)
            if is_summary_text(text):
                return Item("summary", text, label=role)
            return user_item(text, role, observation=is_observation_text(text))
        if role == "assistant":
            calls = _calls(raw) if "tool_calls" in raw or "function_call" in raw else ()
            return _item(
                Item, ("assistant", text, calls, (), False, False, False, role, False, False)
            )
        if role in _HEAD_ROLES:
            return Item("head", text, label=role)
        if role == "tool":
            answered = raw.get("tool_call_id")
            answers = (answered,) if isinstance(answered, str) else ()
            return Item("tool", text, answers=answers, label=role)
        if role == "function":
            name = raw.get("name")
            answers = (LEGACY_CALL_PREFIX + name,) if isinstance(name, str) else ()
            return Item("tool", text, answers=answers, label=role)
        return Item("other", text, label=role)

    def summary_message(self, text: str) -> Message:
        return user_summary(text)

    def is_summary(self, raw: object) -> bool:
        return is_user_summary(raw)

    def measure(self, raw: object, text_cost: Callable[[str], float]) -> float:
        """Content, `name`, `tool_call_id` and every call, each message with its overhead."""
        if not isinstance(raw, dict):
            return MESSAGE_OVERHEAD_TOKENS + text_cost(json_text(raw))
        if len(raw) == 2 and "role" in raw:  # the usual role and content: the same sum, sooner
            content = raw.get("content")
            if isinstance(content, str):
                return float(MESSAGE_OVERHEAD_TOKENS) + text_cost(content)
        total = float(MESSAGE_OVERHEAD_TOKENS)
        total += _measure_content(raw.get("content"), text_cost)
        for key in ("name", "tool_call_id"):
            value = raw.get(key)
            if isinstance(value, str):
                total += text_cost(value)
        calls = raw.get("tool_calls")
        if isinstance(calls, list):
            total += sum(_measure_call(call, text_cost) for call in calls)
        elif calls is not None:
            total += text_cost(json_text(calls))
        if "function_call" in raw:
            total += _measure_call({"function": raw["function_call"]}, text_cost)
        return total

    def with_output(self, raw: object, reduce: Callable[[str], str]) -> Message | None:
        """A tool (or legacy function) message's content, or a tool observation sent as a
        user message."""
        if not isinstance(raw, dict):
            return None
        item = self.read(raw)
        if item.kind != "tool" and not item.observation:
            return None
        return {**raw, "content": reduce(item.text)}


CHAT: Shape = ChatShape()
"""The chat-completions shape, the default everywhere in the library."""


def _calls(message: Message) -> tuple[ToolCall, ...]:
    """Every call an assistant message makes that has an id or a well-formed function."""
    raw_calls = message.get("tool_calls")
    calls: list[ToolCall] = []
    for call in raw_calls if isinstance(raw_calls, list) else []:
        if not isinstance(call, dict):
            continue
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        name, arguments = _function(call.get("function"))
        if call_id is not None or name is not None:
            calls.append(ToolCall(call_id, name, arguments))
    legacy = message.get("function_call")
    name, arguments = _function(legacy)
    if name is not None:
        calls.append(ToolCall(LEGACY_CALL_PREFIX + name, name, arguments))
    return tuple(calls)


def _function(function: object) -> tuple[str | None, str]:
    """(name, arguments) of a `function` object; name None when it is not well formed."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None, ""
    arguments = function.get("arguments")
    return function["name"], arguments if isinstance(arguments, str) else ""


def _measure_content(content: object, text_cost: Callable[[str], float]) -> float:
    if content is None:
        return 0.0
    if isinstance(content, str):
        return text_cost(content)
    if isinstance(content, list):
        return sum(_measure_part(part, text_cost) for part in content)
    return text_cost(json_text(content))


def _measure_part(part: Any, text_cost: Callable[[str], float]) -> float:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return text_cost(part["text"])
    if kind == "image_url":
        image = part.get("image_url")
        detail = image.get("detail") if isinstance(image, dict) else None
        return IMAGE_LOW_TOKENS if detail == "low" else IMAGE_HIGH_TOKENS
    if kind == "input_audio":
        return AUDIO_PART_TOKENS
    if kind == "file":
        file = part.get("file")
        return file_data_tokens(file.get("file_data") if isinstance(file, dict) else None)
    return text_cost(json_text(part))


def _measure_call(call: object, text_cost: Callable[[str], float]) -> float:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return text_cost(json_text(call))
    total = float(TOOL_CALL_OVERHEAD_TOKENS)
    for key in ("name", "arguments"):
        value = function.get(key)
        if isinstance(value, str):
            total += text_cost(value)
        elif value is not None:
            total += text_cost(json_text(value))
    return total
