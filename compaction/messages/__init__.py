"""Message shapes: the only package that looks inside a raw message; the rest reads `Item`s.

A `Shape` turns one raw message (exactly as the caller sent it) into an `Item`, the neutral view
(item.py), and builds the raw message that carries a summary. One module per API shape: `CHAT`
(chat completions, the default everywhere), `RESPONSES` (the Responses API's input items) and
`ANTHROPIC` (Anthropic Messages, with `join_summary` for the wire). What clients inject into a
user turn (injected.py) is read here too: such context is never the person's request.
"""

from __future__ import annotations

from collections.abc import Iterable

from compaction.messages.anthropic import ANTHROPIC, blocks_text, check_turns, join_summary
from compaction.messages.chat import CHAT, LEGACY_CALL_PREFIX, is_message, message_text
from compaction.messages.injected import INJECTED_TAGS, injected_kinds, strip_injected
from compaction.messages.item import (
    AUDIO_PART_TOKENS,
    FILE_PART_TOKENS,
    IMAGE_HIGH_TOKENS,
    IMAGE_LOW_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    OBSERVATION_PREFIXES,
    TOOL_CALL_OVERHEAD_TOKENS,
    Item,
    Kind,
    Shape,
    ToolCall,
    json_text,
    read_all,
)
from compaction.messages.responses import RESPONSES, content_text, is_message_item

__all__ = [
    "ANTHROPIC",
    "AUDIO_PART_TOKENS",
    "CHAT",
    "FILE_PART_TOKENS",
    "IMAGE_HIGH_TOKENS",
    "IMAGE_LOW_TOKENS",
    "INJECTED_TAGS",
    "LEGACY_CALL_PREFIX",
    "MESSAGE_OVERHEAD_TOKENS",
    "OBSERVATION_PREFIXES",
    "RESPONSES",
    "TOOL_CALL_OVERHEAD_TOKENS",
    "Item",
    "Kind",
    "Shape",
    "ToolCall",
    "blocks_text",
    "check_turns",
    "content_text",
    "injected_kinds",
    "is_message",
    "is_message_item",
    "is_summary_message",
    "join_summary",
    "json_text",
    "message_text",
    "read_items",
    "strip_injected",
]


def read_items(messages: Iterable[object], shape: Shape = CHAT) -> list[Item]:
    """The neutral view of each message, in order (a list parallel to `messages`)."""
    return read_all(messages, shape)


def is_summary_message(message: object, shape: Shape = CHAT) -> bool:
    """True for a message this library inserted as a summary of folded history."""
    return shape.is_summary(message)
