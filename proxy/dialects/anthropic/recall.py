"""A tool of the proxy's in Anthropic Messages: declared with its `input_schema`; its calls in a
whole response are `content` `tool_use` blocks, and the request continues with an assistant turn
holding the content, then one user turn of `tool_result` blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from proxy.dialects.base import Call, Calls

Json = dict[str, Any]
"""A response or a request read loosely: each field is narrowed where it is used."""


def declared_tool(name: str, description: str, parameters: Mapping[str, object]) -> Json:
    return {"name": name, "description": description, "input_schema": parameters}


def answer_calls(messages: list[Any], content: object, answered: list[tuple[Call, str]]) -> None:
    """Append the assistant's turn (`content`) and the user turn of its calls' results."""
    messages.append({"role": "assistant", "content": content})
    results = [
        {"type": "tool_result", "tool_use_id": call.id, "content": result}
        for call, result in answered
    ]
    messages.append({"role": "user", "content": results})


def is_tool_call(block: object) -> TypeGuard[Json]:
    """True for a `tool_use` block: a call to one of the client's tools or the proxy's."""
    return isinstance(block, dict) and block.get("type") == "tool_use"


def is_thinking(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")


def _content(response: Json) -> list[Any]:
    content = response.get("content")
    return content if isinstance(content, list) else []


class AnthropicTurns:
    def __init__(self, tool: str) -> None:
        self._tool = tool

    def calls(self, response: Json) -> Calls:
        content = response.get("content")
        if not isinstance(content, list):
            return Calls([], 0)
        recall, others = [], 0
        for block in content:
            if not is_tool_call(block):
                continue
            if block.get("name") == self._tool:
                recall.append(Call(str(block.get("id")), block.get("input")))
            else:
                others += 1
        return Calls(recall, others)

    def without_calls(self, response: Json) -> Json:
        content = response.get("content")
        if not isinstance(content, list):
            return response
        kept = [block for block in content if not self._calls_tool(block)]
        changed = {**response, "content": kept}
        if response.get("stop_reason") == "tool_use" and not any(map(is_tool_call, kept)):
            changed["stop_reason"] = "end_turn"
        return changed

    def after_rounds(self, first: Json, final: Json) -> Json:
        # Thinking the model wrote after a hidden call and its result is bound to that prefix,
        # which the client never has: its next request would send it back bound to a different
        # conversation (docs `build-with-claude/preserved-thinking`). The first response's
        # thinking was written on the client's own prefix: it leads the message.
        thought = [b for b in _content(first) if is_thinking(b)]
        said = [b for b in _content(final) if not is_thinking(b)]
        return {**final, "content": [*thought, *said]}

    def continue_with(
        self, payload: Json, response: Json, answered: list[tuple[Call, str]]
    ) -> None:
        answer_calls(payload["messages"], response.get("content"), answered)

    def _calls_tool(self, block: object) -> bool:
        return is_tool_call(block) and block.get("name") == self._tool
