"""The one module that knows a message shape; the rest of the library reads `Item`s.

A `Shape` turns one raw message (exactly as the caller sent it) into an `Item`, the neutral view
that segmenting, pairing checks, transcripts, ledgers and extraction work from, and builds the raw
message that carries a summary. `CHAT` is the chat-completions shape: roles, `tool_calls`,
`tool_call_id`, content strings and part arrays, `name`, and the legacy `function_call` /
`role: function` pair. Other API shapes (Responses, Anthropic) implement the same Protocol.

Raw messages are never edited: an Item is derived, computed once per message, and the library
keeps the raw list and a parallel list of Items side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from compaction.marker import is_summary_text

Kind = Literal["head", "user", "assistant", "tool", "summary", "other"]
"""head: system/developer instructions; user: a user turn (a tool observation included, see
`Item.observation`); assistant: the model's turn; tool: a tool's result; summary: a summary this
library inserted; other: anything else, malformed items included."""

OBSERVATION_PREFIXES = ("<returncode>", "Please always provide EXACTLY ONE action")
"""mini-swe-agent's shell output and its malformed-action reminder: user-role, not requests."""

LEGACY_CALL_PREFIX = "function_call:"

# Token costs the chat template adds. Images: OpenAI's published costs (`detail: low` is flat,
# high/auto typically a 2x2-tile image); audio and files: rough flat costs for media we do not
# decode; a message's role and separators; a call's id, type and JSON framing.
IMAGE_LOW_TOKENS = 85
IMAGE_HIGH_TOKENS = 765
AUDIO_PART_TOKENS = 200
FILE_PART_TOKENS = 500
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_CALL_OVERHEAD_TOKENS = 8

_HEAD_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model makes. `id` is None when the raw call has none; `name` is None when it
    is not a well-formed function call (such a call still counts for pairing by its id)."""

    id: str | None
    name: str | None
    arguments: str
    """The raw JSON text the model produced (may be invalid JSON)."""

    def parsed(self) -> dict[str, Any]:
        """The arguments as a dict; {} when they are not a JSON object."""
        try:
            value = orjson.loads(self.arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class Item:
    """The neutral view of one raw message."""

    kind: Kind
    text: str = ""
    """Its prose text, for transcripts and ledgers (a malformed item: its repr)."""
    calls: tuple[ToolCall, ...] = ()
    answers: tuple[str, ...] = ()
    """The call ids this item answers (a tool result without an id answers none)."""
    observation: bool = False
    """A user-role message that is really tool output."""
    lead: bool = False
    """Must stay glued to the item after it (a Responses `reasoning` item); never for chat."""
    joins: bool = False
    """A call item that joins the call items just before it when their results have not started
    yet (Responses sends one item per call); never for chat, where a new assistant message with
    calls leaves the earlier calls unanswered."""
    label: str = ""
    """What a transcript calls it: the role or item type; "" for a malformed item."""

    @property
    def call_ids(self) -> tuple[str, ...]:
        """The ids of its calls: what the following results must answer."""
        return tuple(call.id for call in self.calls if call.id is not None)

    @property
    def functions(self) -> tuple[ToolCall, ...]:
        """Its well-formed function calls (those with a name)."""
        return tuple(call for call in self.calls if call.name is not None)

    @property
    def is_request(self) -> bool:
        """Something the user wrote: not a summary, not a tool observation."""
        return self.kind == "user" and not self.observation

    @property
    def is_prose(self) -> bool:
        """What the user or the assistant wrote (no tool output)."""
        return self.is_request or self.kind == "assistant"

    @property
    def is_malformed(self) -> bool:
        return self.kind == "other" and not self.label


class Shape(Protocol):
    """What the library needs to know about one API's message shape."""

    def read(self, raw: Any) -> Item:
        """The neutral view of `raw`; never raises, whatever `raw` is."""
        ...

    def summary_message(self, text: str) -> Any:
        """The raw message that carries a summary whose full text (marker included) is `text`."""
        ...

    def is_summary(self, raw: Any) -> bool:
        """True for a message this library inserted as a summary (see marker.py)."""
        ...

    def measure(self, raw: Any, text_cost: Callable[[str], float]) -> float:
        """Tokens of `raw`: `text_cost` for each string, flat costs for media and framing."""
        ...


def is_message(item: object) -> bool:
    """True for a dict with a string role: the only chat item the library looks inside."""
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


def json_text(item: Any) -> str:
    """Any item as the JSON text the upstream would see; never raises."""
    try:
        return orjson.dumps(item, default=str).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(item)


class ChatShape:
    """The chat-completions message shape."""

    def read(self, raw: Any) -> Item:
        if not is_message(raw):
            return Item("other", repr(raw))
        role: str = raw["role"]
        text = message_text(raw)
        if role in _HEAD_ROLES:
            return Item("head", text, label=role)
        if role == "user":
            if self.is_summary(raw):
                return Item("summary", text, label=role)
            return Item("user", text, observation=_is_observation(raw), label=role)
        if role == "assistant":
            return Item("assistant", text, calls=_calls(raw), label=role)
        if role == "tool":
            answered = raw.get("tool_call_id")
            answers = (answered,) if isinstance(answered, str) else ()
            return Item("tool", text, answers=answers, label=role)
        if role == "function":
            name = raw.get("name")
            answers = (LEGACY_CALL_PREFIX + name,) if isinstance(name, str) else ()
            return Item("tool", text, answers=answers, label=role)
        return Item("other", text, label=role)

    def summary_message(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def is_summary(self, raw: Any) -> bool:
        if not isinstance(raw, dict) or raw.get("role") != "user":
            return False
        content = raw.get("content")
        return isinstance(content, str) and is_summary_text(content)

    def measure(self, raw: Any, text_cost: Callable[[str], float]) -> float:
        """Content, `name`, `tool_call_id` and every call, each message with its overhead."""
        if not isinstance(raw, dict):
            return MESSAGE_OVERHEAD_TOKENS + text_cost(json_text(raw))
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


CHAT: Shape = ChatShape()
"""The chat-completions shape, the default everywhere in the library."""


def read_items(messages: Iterable[Any], shape: Shape = CHAT) -> list[Item]:
    """The neutral view of each message, in order (a list parallel to `messages`)."""
    return [shape.read(message) for message in messages]


def is_summary_message(message: Any, shape: Shape = CHAT) -> bool:
    """True for a message this library inserted as a summary of folded history."""
    return shape.is_summary(message)


def _is_observation(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.lstrip().startswith(OBSERVATION_PREFIXES)


def _calls(message: dict[str, Any]) -> tuple[ToolCall, ...]:
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


def _function(function: Any) -> tuple[str | None, str]:
    """(name, arguments) of a `function` object; name None when it is not well formed."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None, ""
    arguments = function.get("arguments")
    return function["name"], arguments if isinstance(arguments, str) else ""


def _measure_content(content: Any, text_cost: Callable[[str], float]) -> float:
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
        return FILE_PART_TOKENS
    return text_cost(json_text(part))


def _measure_call(call: Any, text_cost: Callable[[str], float]) -> float:
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
