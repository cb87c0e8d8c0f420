"""A whole (non-streamed) response's calls to `recall` in each dialect: finding them, taking them
out, and continuing the request with the call and its result (the history a strict upstream
accepts: every call answered, ids matching).

- chat: `choices[0].message.tool_calls` -> an assistant message with the calls, then one `tool`
  message per call;
- responses: `output` `function_call` items -> the response's output items, then one
  `function_call_output` per call;
- anthropic: `content` `tool_use` blocks -> an assistant turn with the content, then one user
  turn of `tool_result` blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.recall.tools import NAME

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Call:
    id: str
    arguments: object
    """A JSON text (chat, responses) or an object (anthropic)."""


@dataclass(frozen=True)
class Calls:
    recall: list[Call]
    others: int
    """Calls to the client's own tools."""


class Turns(Protocol):
    def calls(self, response: JsonObject) -> Calls: ...

    def without_recall(self, response: JsonObject) -> JsonObject:
        """`response` as the client would have had it without the recall calls."""
        ...

    def continue_with(
        self, payload: JsonObject, response: JsonObject, answered: list[tuple[Call, str]]
    ) -> None:
        """Append `response`'s turn and the answers to its calls to `payload`'s list."""
        ...


class ChatTurns:
    def _message(self, response: JsonObject) -> JsonObject | None:
        choices = response.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return None
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None

    def calls(self, response: JsonObject) -> Calls:
        message = self._message(response)
        tool_calls = message.get("tool_calls") if message is not None else None
        if not isinstance(tool_calls, list):
            return Calls([], 0)
        recall = []
        for call in tool_calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and function.get("name") == NAME:
                recall.append(Call(str(call.get("id")), function.get("arguments")))
        return Calls(recall, len(tool_calls) - len(recall))

    def without_recall(self, response: JsonObject) -> JsonObject:
        message = self._message(response)
        if message is None or not isinstance(message.get("tool_calls"), list):
            return response
        kept = [call for call in message["tool_calls"] if not _calls_recall(call)]
        changed = {key: value for key, value in message.items() if key != "tool_calls"}
        if kept:
            changed["tool_calls"] = kept
        choice = {**response["choices"][0], "message": changed}
        if not kept and choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "stop"
        return {**response, "choices": [choice]}

    def continue_with(
        self, payload: JsonObject, response: JsonObject, answered: list[tuple[Call, str]]
    ) -> None:
        message = self._message(response) or {}
        turn: JsonObject = {"role": "assistant", "content": message.get("content")}
        turn["tool_calls"] = message.get("tool_calls")
        payload["messages"].append(turn)
        for call, result in answered:
            payload["messages"].append({"role": "tool", "tool_call_id": call.id, "content": result})


def _calls_recall(call: object) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and function.get("name") == NAME


class ResponsesTurns:
    def calls(self, response: JsonObject) -> Calls:
        output = response.get("output")
        if not isinstance(output, list):
            return Calls([], 0)
        recall, others = [], 0
        for item in output:
            if not isinstance(item, dict) or item.get("type") != "function_call":
                continue
            if item.get("name") == NAME:
                recall.append(Call(str(item.get("call_id")), item.get("arguments")))
            else:
                others += 1
        return Calls(recall, others)

    def without_recall(self, response: JsonObject) -> JsonObject:
        output = response.get("output")
        if not isinstance(output, list):
            return response
        return {**response, "output": [item for item in output if not _is_recall_item(item)]}

    def continue_with(
        self, payload: JsonObject, response: JsonObject, answered: list[tuple[Call, str]]
    ) -> None:
        items = payload["input"]
        items.extend(item for item in response.get("output") or [] if isinstance(item, dict))
        for call, result in answered:
            items.append({"type": "function_call_output", "call_id": call.id, "output": result})


def _is_recall_item(item: object) -> bool:
    return (
        isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == NAME
    )


class AnthropicTurns:
    def calls(self, response: JsonObject) -> Calls:
        content = response.get("content")
        if not isinstance(content, list):
            return Calls([], 0)
        recall, others = [], 0
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_use":
                continue
            if block.get("name") == NAME:
                recall.append(Call(str(block.get("id")), block.get("input")))
            else:
                others += 1
        return Calls(recall, others)

    def without_recall(self, response: JsonObject) -> JsonObject:
        content = response.get("content")
        if not isinstance(content, list):
            return response
        kept = [block for block in content if not _is_recall_block(block)]
        changed = {**response, "content": kept}
        if response.get("stop_reason") == "tool_use" and not any(
            isinstance(block, dict) and block.get("type") == "tool_use" for block in kept
        ):
            changed["stop_reason"] = "end_turn"
        return changed

    def continue_with(
        self, payload: JsonObject, response: JsonObject, answered: list[tuple[Call, str]]
    ) -> None:
        messages = payload["messages"]
        messages.append({"role": "assistant", "content": response.get("content")})
        results = [
            {"type": "tool_result", "tool_use_id": call.id, "content": result}
            for call, result in answered
        ]
        messages.append({"role": "user", "content": results})


def _is_recall_block(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == NAME


TURNS: Mapping[str, Turns] = {
    "chat": ChatTurns(),
    "responses": ResponsesTurns(),
    "anthropic": AnthropicTurns(),
}


def add_usage(total: object, more: object) -> object:
    """Two `usage` objects summed field by field (nested details included); a field only one
    has is kept as it is."""
    if not isinstance(total, dict) or not isinstance(more, dict):
        return total if more is None else more if total is None else total
    summed = dict(total)
    for key, value in more.items():
        mine = summed.get(key)
        if isinstance(value, int) and isinstance(mine, int) and not isinstance(value, bool):
            summed[key] = mine + value
        elif isinstance(value, dict) and isinstance(mine, dict):
            summed[key] = add_usage(mine, value)
        elif key not in summed:
            summed[key] = value
    return summed
