"""The one module that knows the chat-completions message shape.

Roles, `tool_calls`, `tool_call_id`, content strings and part arrays: everything else in the
library reads messages through the functions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from compaction.marker import is_summary_message

OBSERVATION_PREFIX = "<returncode>"
"""mini-swe-agent returns shell output as a user message that starts with this tag."""


def is_message(item: object) -> bool:
    """True for a dict with a string role: the only shape the library looks inside."""
    return isinstance(item, dict) and isinstance(item.get("role"), str)


def message_text(message: Any) -> str:
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


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The raw JSON text the model produced (may be invalid JSON)."""

    def parsed(self) -> dict[str, Any]:
        """The arguments as a dict; {} when they are not a JSON object."""
        try:
            value = orjson.loads(self.arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


def tool_calls(message: Any) -> list[ToolCall]:
    """The well-formed function calls an assistant message makes."""
    if not is_message(message) or message["role"] != "assistant":
        return []
    calls = message.get("tool_calls")
    found: list[ToolCall] = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            arguments = function.get("arguments")
            found.append(
                ToolCall(function["name"], arguments if isinstance(arguments, str) else "")
            )
    return found


def is_observation(message: Any) -> bool:
    """A user message that is really a tool's output (mini-swe-agent's text protocol)."""
    return (
        is_message(message)
        and message["role"] == "user"
        and isinstance(message.get("content"), str)
        and message["content"].lstrip().startswith(OBSERVATION_PREFIX)
    )


def is_user_request(message: Any) -> bool:
    """A message the user wrote: not a summary, not a tool observation."""
    return (
        is_message(message)
        and message["role"] == "user"
        and not is_summary_message(message)
        and not is_observation(message)
    )
