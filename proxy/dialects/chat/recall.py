"""A tool of the proxy's in Chat Completions: declared as a `function` tool; its calls in a whole
response are `choices[0].message.tool_calls`, and the request continues with an assistant
message holding the calls, then one `tool` message per call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.dialects.base import Call, Calls

Json = dict[str, Any]
"""A response, a request or an event read loosely: each field is narrowed where it is used."""


def function_tool(
    name: str, description: str, parameters: Mapping[str, object]
) -> dict[str, object]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def answer_calls(
    messages: list[object], content: object, calls: object, answered: list[tuple[Call, str]]
) -> None:
    """Append the assistant's turn (`content`, `calls`) and one `tool` message per answer."""
    messages.append({"role": "assistant", "content": content, "tool_calls": calls})
    for call, result in answered:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


class ChatTurns:
    def __init__(self, tool: str) -> None:
        self._tool = tool

    def _message(self, response: Json) -> Json | None:
        choices = response.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return None
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None

    def calls(self, response: Json) -> Calls:
        message = self._message(response)
        tool_calls = message.get("tool_calls") if message is not None else None
        if not isinstance(tool_calls, list):
            return Calls([], 0)
        recall = []
        for call in tool_calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and function.get("name") == self._tool:
                recall.append(Call(str(call.get("id")), function.get("arguments")))
        return Calls(recall, len(tool_calls) - len(recall))

    def after_rounds(self, first: Json, final: Json) -> Json:
        return final

    def without_calls(self, response: Json) -> Json:
        message = self._message(response)
        tool_calls = message.get("tool_calls") if message is not None else None
        if message is None or not isinstance(tool_calls, list):
            return response
        kept = [call for call in tool_calls if not self._calls_tool(call)]
        changed = {key: value for key, value in message.items() if key != "tool_calls"}
        if kept:
            changed["tool_calls"] = kept
        choice = {**response["choices"][0], "message": changed}
        if not kept and choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "stop"
        return {**response, "choices": [choice]}

    def continue_with(
        self, payload: Json, response: Json, answered: list[tuple[Call, str]]
    ) -> None:
        message = self._message(response) or {}
        answer_calls(
            payload["messages"], message.get("content"), message.get("tool_calls"), answered
        )

    def _calls_tool(self, call: object) -> bool:
        function = call.get("function") if isinstance(call, dict) else None
        return isinstance(function, dict) and function.get("name") == self._tool
