"""The OpenAI Responses API's `input` item shape.

Messages (`{"type": "message", "role", "content"}`, or the short form without `type`) carry a
string or `input_text` / `output_text` parts. Calls are items of their own, one per call
(`function_call`, `custom_tool_call`, `local_shell_call`, any `*_call` with a `call_id`), answered
by `*_call_output` items with the same `call_id`; consecutive call items before their outputs
form one block (`Item.joins`). A `reasoning` item (its `encrypted_content` opaque) and the
model's `message` stay glued to the item they precede (`Item.lead`): a model turn (reasoning,
message, calls) is kept or folded whole, byte for byte, since the API refuses a call whose
turn's reasoning is missing. A `compaction` item (the provider's sealed summary of what came
before it, or any other item the provider sealed in an `encrypted_content` that is not
reasoning) is `Item.sealed`: the head ends after it.
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
    encrypted_tokens,
    file_data_tokens,
    is_observation_text,
    json_text,
    measure_value,
    sealed_summary_tokens,
    user_item,
)
from compaction.types import Message

_HEAD_ROLES = frozenset({"system", "developer"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "refusal"})


def content_text(content: object) -> str:
    """The readable text of a message's content or a call's output: strings, text parts, and
    placeholders for media."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            continue
        text = part.get("text", part.get("refusal"))
        if part["type"] in _TEXT_PARTS and isinstance(text, str):
            pieces.append(text)
        else:
            pieces.append(f"[{part['type']}]")
    return "\n".join(pieces)


def is_message_item(raw: object) -> bool:
    """A message item: typed `message`, or the short form with a role and no type."""
    return (
        isinstance(raw, dict)
        and raw.get("type", "message") == "message"
        and isinstance(raw.get("role"), str)
    )


class ResponsesShape:
    """The Responses API's input items."""

    def read(self, raw: Any) -> Item:
        if is_message_item(raw):
            return self._read_message(raw)
        kind = raw.get("type") if isinstance(raw, dict) else None
        if not isinstance(kind, str):
            return Item("other", repr(raw))
        if kind == "reasoning":
            return Item("other", content_text(raw.get("summary")), lead=True, label=kind)
        if _is_sealed(raw, kind):
            return Item("other", label=kind, sealed=True)
        call_id = raw.get("call_id")
        if kind.endswith("_call_output"):
            answers = (call_id,) if isinstance(call_id, str) else ()
            return Item("tool", content_text(raw.get("output")), answers=answers, label=kind)
        if kind.endswith("_call") and isinstance(call_id, str):
            call = ToolCall(call_id, _name(raw), _arguments(raw))
            return Item("assistant", calls=(call,), joins=True, label=kind)
        return Item("other", label=kind)

    def summary_message(self, text: str) -> Message:
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    def is_summary(self, raw: Any) -> bool:
        if not is_message_item(raw) or raw.get("role") != "user":
            return False
        content = raw.get("content")
        if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
            content = content[0].get("text")
        return isinstance(content, str) and is_summary_text(content)

    def measure(self, raw: object, text_cost: Callable[[str], float]) -> float:
        """Content parts, call names and arguments, outputs, reasoning; each with its overhead."""
        if not isinstance(raw, dict):
            return MESSAGE_OVERHEAD_TOKENS + text_cost(json_text(raw))
        total = float(MESSAGE_OVERHEAD_TOKENS)
        if is_message_item(raw):
            return total + _measure_content(raw.get("content"), text_cost)
        kind = raw.get("type")
        if kind == "reasoning":
            total += _measure_content(raw.get("summary"), text_cost)
            return total + encrypted_tokens(raw.get("encrypted_content"))
        if isinstance(kind, str) and _is_sealed(raw, kind):
            return total + sealed_summary_tokens(raw.get("encrypted_content"))
        if isinstance(kind, str) and kind.endswith("_call_output"):
            return total + _measure_content(raw.get("output"), text_cost)
        if kind == "image_generation_call":  # its `result` is the image, in base64
            return total + IMAGE_HIGH_TOKENS
        if isinstance(kind, str) and kind.endswith("_call"):
            name = raw.get("name")
            return (
                total
                + TOOL_CALL_OVERHEAD_TOKENS
                + measure_value(name if isinstance(name, str) else None, text_cost)
                + text_cost(_arguments(raw))
            )
        return total + text_cost(json_text(raw))

    def with_output(self, raw: object, reduce: Callable[[str], str]) -> Message | None:
        """A `*_call_output` item's `output`."""
        kind = raw.get("type") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or not isinstance(kind, str):
            return None
        if not kind.endswith("_call_output"):
            return None
        return {**raw, "output": reduce(content_text(raw.get("output")))}

    def _read_message(self, raw: Message) -> Item:
        role: str = raw["role"]
        text = content_text(raw.get("content"))
        if role in _HEAD_ROLES:
            return Item("head", text, label=role)
        if role == "user":
            if self.is_summary(raw):
                return Item("summary", text, label=role)
            return user_item(text, role, observation=is_observation_text(text))
        if role == "assistant":
            # The model's message and the calls after it are one turn (one reasoning item may
            # precede them all): glued to what follows, like the reasoning.
            return Item("assistant", text, lead=True, label=role)
        return Item("other", text, label=role)


RESPONSES: Shape = ResponsesShape()
"""The Responses API's input item shape."""


def _is_sealed(raw: Message, kind: str) -> bool:
    """A provider's compaction: a `compaction` item (developers.openai.com/api/docs/guides/
    compaction: "opaque and not intended to be human-interpretable"), or any item but reasoning
    that the provider sealed (Codex's `context_compaction`)."""
    return kind == "compaction" or (
        kind != "reasoning" and isinstance(raw.get("encrypted_content"), str)
    )


def _name(raw: Message) -> str | None:
    name = raw.get("name")
    if isinstance(name, str):
        return name
    return "local_shell" if raw.get("type") == "local_shell_call" else None


def _arguments(raw: Message) -> str:
    """The call's input as text: `arguments` (function), `input` (custom), `action` (shell)."""
    for key in ("arguments", "input", "action"):
        value = raw.get(key)
        if isinstance(value, str):
            return value
        if value is not None:
            return json_text(value)
    return ""


def _measure_content(content: object, text_cost: Callable[[str], float]) -> float:
    if isinstance(content, dict):  # one part on its own (a computer call's screenshot)
        return _measure_part(content, text_cost)
    if not isinstance(content, list):
        return measure_value(content, text_cost)
    return sum(_measure_part(part, text_cost) for part in content)


def _measure_part(part: Any, text_cost: Callable[[str], float]) -> float:
    kind = part.get("type") if isinstance(part, dict) else None
    text = part.get("text") if isinstance(part, dict) else None
    if isinstance(kind, str) and kind in _TEXT_PARTS and isinstance(text, str):
        return text_cost(text)
    if kind in ("input_image", "computer_screenshot"):
        return IMAGE_LOW_TOKENS if part.get("detail") == "low" else IMAGE_HIGH_TOKENS
    if kind == "input_audio":
        return AUDIO_PART_TOKENS
    if kind == "input_file":
        return file_data_tokens(part.get("file_data"))
    return text_cost(json_text(part))
