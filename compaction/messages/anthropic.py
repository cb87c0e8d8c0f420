"""Anthropic's Messages API message shape, and the one arrangement it needs on the wire.

The top-level `system` is not in the list (a caller keeps it). Messages are `user` / `assistant`
turns whose content is a string or content blocks: `tool_use` blocks of an assistant turn are
answered by `tool_result` blocks (same `tool_use_id`) of the next user turn, so the two messages
are one block; `thinking` / `redacted_thinking` blocks and their signatures, and `cache_control`
markers, ride along untouched because kept messages are never edited.

Turns must alternate and start with a user turn. The summary is a user message placed first; the
user turns right after it (pinned requests, a kept user turn) are joined with it into one turn by
`join_summary`, deterministically, so the forwarded prefix stays byte-stable between compactions.
The library itself keeps them apart (kept messages stay the caller's own objects); `join_summary`
is what goes on the wire.

A turn holding a signed `compaction` block (Anthropic's own summary of what it replaced, which
must stay first in `messages`, byte-exact) is `Item.sealed`: the head ends after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from compaction.messages.item import (
    FILE_PART_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    TOOL_CALL_OVERHEAD_TOKENS,
    Item,
    Shape,
    ToolCall,
    encrypted_tokens,
    file_data_tokens,
    is_observation_text,
    is_user_summary,
    json_text,
    measure_value,
    user_item,
    user_summary,
)
from compaction.types import Message

IMAGE_TOKENS = 1600
"""A large image as Claude counts it (about width x height / 750, capped near 1600)."""


def _blocks(content: object) -> list[dict[str, Any]]:
    """The content as a list of block dicts (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def blocks_text(content: object) -> str:
    """Readable text of content: strings and text blocks, tool results' text, placeholders."""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            pieces.append(block["text"])
        elif kind == "tool_result":
            pieces.append(blocks_text(block.get("content")))
        elif kind in ("thinking", "redacted_thinking", "tool_use"):
            continue  # reasoning is not prose; calls are Item.calls
        elif isinstance(kind, str):
            pieces.append(f"[{kind}]")
    return "\n".join(piece for piece in pieces if piece)


class AnthropicShape:
    """Anthropic Messages: user and assistant turns of content blocks."""

    def read(self, raw: Any) -> Item:
        item = self._read(raw)
        # The block leads its turn wherever the API puts it (first in `messages` on demand,
        # first in the reply at a threshold): only the first block is looked at.
        content = raw.get("content") if isinstance(raw, dict) else None
        if isinstance(content, list) and content and _is_compaction(content[0]):
            return item._replace(sealed=True)
        return item

    def _read(self, raw: Any) -> Item:
        role = raw.get("role") if isinstance(raw, dict) else None
        if not isinstance(role, str):
            return Item("other", repr(raw))
        content = raw.get("content")
        text = blocks_text(content)
        if role == "user":
            if self.is_summary(raw):
                return Item("summary", text, label=role)
            answers = tuple(
                block["tool_use_id"]
                for block in _blocks(content)
                if block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str)
            )
            if answers:
                return Item("tool", text, answers=answers, label=role)
            observation = isinstance(content, str) and is_observation_text(text)
            return user_item(text, role, observation=observation)
        if role == "assistant":
            return Item("assistant", text, calls=_calls(content), label=role)
        return Item("other", text, label=role)

    def summary_message(self, text: str) -> Message:
        return user_summary(text)

    def is_summary(self, raw: object) -> bool:
        return is_user_summary(raw)

    def measure(self, raw: object, text_cost: Callable[[str], float]) -> float:
        """Every block with the message's overhead; thinking only in a turn that calls tools.

        Anthropic strips thinking from turns before the last user turn, except in the current
        tool loop. A turn without tool_use ended its task (a user turn follows), so its thinking
        is never counted. A message is measured on its own, so a tool-calling turn of an earlier
        task still counts its thinking: erring high."""
        if not isinstance(raw, dict):
            return MESSAGE_OVERHEAD_TOKENS + text_cost(json_text(raw))
        content = raw.get("content")
        if not isinstance(content, list):
            return MESSAGE_OVERHEAD_TOKENS + measure_value(content, text_cost)
        blocks: list[Any] = content
        if not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
            blocks = [b for b in content if not _is_thinking(b)]
        return MESSAGE_OVERHEAD_TOKENS + sum(_measure_block(b, text_cost) for b in blocks)

    def with_output(self, raw: object, reduce: Callable[[str], str]) -> Message | None:
        """Each `tool_result` block's content of a user turn (its other blocks, the user's
        own text included, untouched), or a tool observation sent as a user turn's string."""
        if not isinstance(raw, dict) or raw.get("role") != "user":
            return None
        content = raw.get("content")
        if isinstance(content, str):
            return {**raw, "content": reduce(content)} if self.read(raw).observation else None
        if not isinstance(content, list) or not any(_is_result(b) for b in content):
            return None
        return {**raw, "content": [_reduced(b, reduce) if _is_result(b) else b for b in content]}


def _reduced(block: dict[str, Any], reduce: Callable[[str], str]) -> dict[str, Any]:
    """A `tool_result` block with its content reduced; the block itself when `reduce` leaves
    its text as it was."""
    text = blocks_text(block.get("content"))
    reduced = reduce(text)
    return block if reduced == text else {**block, "content": reduced}


ANTHROPIC: Shape = AnthropicShape()
"""Anthropic's Messages API message shape."""


def join_summary(messages: Sequence[Message]) -> list[Message]:
    """`messages` as Anthropic accepts them: the summary and the user turns right after it (the
    pinned requests, a kept user turn) become one user turn, as Anthropic would combine them.

    The joined turn is a new dict (the caller's messages are not edited): the summary's text
    block, then the other turns' blocks in order, `tool_result` blocks first as Anthropic wants."""
    for index, message in enumerate(messages):
        if not ANTHROPIC.is_summary(message):
            continue
        end = index + 1
        while end < len(messages) and _is_user(messages[end]):
            end += 1
        if end == index + 1:
            break
        blocks = [{"type": "text", "text": message["content"]}]
        for turn in messages[index + 1 : end]:
            content = turn.get("content")
            blocks += list(content) if isinstance(content, list) else _blocks(content)
        ordered = [b for b in blocks if _is_result(b)] + [b for b in blocks if not _is_result(b)]
        joined = {**messages[index + 1], "content": ordered}
        return [*messages[:index], joined, *messages[end:]]
    return list(messages)


def check_turns(messages: Sequence[Message]) -> list[str]:
    """What Anthropic would refuse in the order of turns: a first turn that is not the user's,
    two turns of one role in a row."""
    problems: list[str] = []
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if roles and roles[0] != "user":
        problems.append(f"message 0: the first turn is {roles[0]!r}, not 'user'")
    for index in range(1, len(roles)):
        if roles[index] == roles[index - 1]:
            problems.append(f"message {index}: a second {roles[index]!r} turn in a row")
    return problems


def _is_user(message: object) -> bool:
    return isinstance(message, dict) and message.get("role") == "user"


def _is_thinking(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")


def _is_compaction(block: object) -> bool:
    """Anthropic's signed summary block (platform.claude.com/docs/en/build-with-claude/
    compaction-on-demand: "Keep the `compaction` block exactly as the API returned it")."""
    return isinstance(block, dict) and block.get("type") == "compaction"


def _is_result(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def _calls(content: object) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for block in _blocks(content):
        if block.get("type") != "tool_use":
            continue
        call_id = block.get("id") if isinstance(block.get("id"), str) else None
        name = block.get("name") if isinstance(block.get("name"), str) else None
        if call_id is not None or name is not None:
            calls.append(ToolCall(call_id, name, json_text(block.get("input", {}))))
    return tuple(calls)


def _measure_block(block: Any, text_cost: Callable[[str], float]) -> float:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return measure_value(block.get("text"), text_cost)
    if kind == "thinking":  # its `signature` only proves the text: not charged
        return measure_value(block.get("thinking"), text_cost)
    if kind == "redacted_thinking":
        return encrypted_tokens(block.get("data"))
    if kind == "compaction":  # the summary Claude reads; its `signature` only proves it
        return measure_value(block.get("content"), text_cost)
    if kind == "tool_use":
        return (
            TOOL_CALL_OVERHEAD_TOKENS
            + measure_value(block.get("name"), text_cost)
            + measure_value(block.get("input"), text_cost)
        )
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            return TOOL_CALL_OVERHEAD_TOKENS + sum(_measure_block(b, text_cost) for b in content)
        return TOOL_CALL_OVERHEAD_TOKENS + measure_value(content, text_cost)
    if kind == "image":
        return IMAGE_TOKENS
    if kind == "document":
        return _measure_document(block.get("source"), text_cost)
    return text_cost(json_text(block))


def _measure_document(source: Any, text_cost: Callable[[str], float]) -> float:
    """A text document by its text, a content document by its blocks, a base64 one (a PDF) by
    its length; one sent by reference (URL, file id) at a flat cost."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text":
        return measure_value(source.get("data"), text_cost)
    if kind == "content":
        content = source.get("content")
        if isinstance(content, list):
            return sum(_measure_block(b, text_cost) for b in content)
        return measure_value(content, text_cost)
    if kind == "base64":
        return file_data_tokens(source.get("data"))
    return FILE_PART_TOKENS
