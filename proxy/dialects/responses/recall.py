"""A tool of the proxy's in the Responses API: declared as a `function` tool; its calls in a
whole response are `output` `function_call` items, and the request continues with the
response's output items, then one `function_call_output` per call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from proxy.dialects.base import Call, Calls

Json = dict[str, Any]
"""A response or a request read loosely: each field is narrowed where it is used."""


def function_tool(name: str, description: str, parameters: Mapping[str, object]) -> Json:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": parameters,
        "strict": False,
    }


def answer_calls(items: list[Any], output: list[Json], answered: list[tuple[Call, str]]) -> None:
    """Append the response's `output` items and one `function_call_output` per answer."""
    items.extend(output)
    for call, result in answered:
        items.append({"type": "function_call_output", "call_id": call.id, "output": result})


def is_function_call(item: object) -> TypeGuard[Json]:
    return isinstance(item, dict) and item.get("type") == "function_call"


def calls_tool(item: object, tool: str) -> bool:
    return is_function_call(item) and item.get("name") == tool


def is_reasoning(item: object) -> bool:
    return isinstance(item, dict) and item.get("type") == "reasoning"


def without_tool_calls(output: list[Any], tool: str) -> list[Any]:
    """`output` without the calls to `tool`, and without the reasoning item right before each:
    a reasoning item goes back to the API only with the item that followed it ("... was
    provided without its required following item")."""
    kept: list[Any] = []
    for item in output:
        if calls_tool(item, tool):
            if kept and is_reasoning(kept[-1]):
                kept.pop()
            continue
        kept.append(item)
    return kept


class ResponsesTurns:
    def __init__(self, tool: str) -> None:
        self._tool = tool

    def calls(self, response: Json) -> Calls:
        output = response.get("output")
        if not isinstance(output, list):
            return Calls([], 0)
        recall, others = [], 0
        for item in output:
            if not is_function_call(item):
                continue
            if item.get("name") == self._tool:
                recall.append(Call(str(item.get("call_id")), item.get("arguments")))
            else:
                others += 1
        return Calls(recall, others)

    def without_calls(self, response: Json) -> Json:
        output = response.get("output")
        if not isinstance(output, list):
            return response
        return {**response, "output": without_tool_calls(output, self._tool)}

    def after_rounds(self, first: Json, final: Json) -> Json:
        # The first response is not shown (its reasoning went with its call); each of the
        # final's reasoning items is followed by its own item.
        return final

    def continue_with(
        self, payload: Json, response: Json, answered: list[tuple[Call, str]]
    ) -> None:
        output = [item for item in response.get("output") or [] if isinstance(item, dict)]
        answer_calls(payload["input"], output, answered)
