"""A chat completion streamed as `chat.completion.chunk`s, across the rounds that answer the
proxy's tool: the tool's `tool_calls` deltas are dropped, the client's calls renumbered; every
chunk carries the first response's `id`; `[DONE]` once; usage summed over the rounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.dialects.base import Call
from proxy.dialects.chat.recall import answer_calls
from proxy.dialects.events import StreamReader, data_event, event_data
from proxy.dialects.usage import add_usage

Json = dict[str, Any]
"""A response, a request or an event read loosely: each field is narrowed where it is used."""


@dataclass
class _StreamedCall:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)
    client_index: int | None = None
    """Its index as the client sees it (None: a call of the proxy's tool, never shown)."""


class ChatStream(StreamReader):
    """A chat completion streamed as `chat.completion.chunk`s."""

    def __init__(self, tool: str) -> None:
        self._id: object = None
        super().__init__(tool)

    def begin(self) -> None:
        super().begin()
        self._calls: dict[int, _StreamedCall] = {}
        self._text: list[str] = []
        self._finish: Json | None = None
        self._done = False

    @property
    def recall(self) -> list[Call]:
        return [
            Call(call.id, "".join(call.arguments))
            for call in self._calls.values()
            if call.client_index is None
        ]

    def read(self, event: bytes) -> bytes | None:
        data = event_data(event)
        if data is None:
            return event
        if data.strip() == b"[DONE]":
            if self._holding:
                self._done = True
                return None
            return event
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(chunk, dict):
            return event
        return self._read_chunk(event, chunk)

    def _read_chunk(self, event: bytes, chunk: Json) -> bytes | None:
        changed = False
        if self._id is None:
            self._id = chunk.get("id")
        elif chunk.get("id") != self._id:
            chunk["id"] = self._id
            changed = True
        usage = chunk.get("usage")
        if usage is not None:
            if self._first_usage is None:
                self._first_usage = usage
            self._spent = add_usage(self._spent, usage)
            if self._prior is not None:
                chunk["usage"] = add_usage(self._prior, usage)
                changed = True
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else None
        if self._holding:
            return None  # after a finish that only called the tool: usage and the like wait
        if isinstance(choice, dict):
            kept = self._read_choice(choice)
            if kept is False:
                return None
            changed = changed or kept is True
            if choice.get("finish_reason") == "tool_calls" and self.recall and not self._clients:
                self._holding, self._finish = True, chunk
                return None
        return data_event(chunk) if changed else event

    def _read_choice(self, choice: Json) -> bool | None:
        """True: the choice was changed; False: nothing of it is left to send; None: as is."""
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        content = delta.get("content")
        if isinstance(content, str):
            self._text.append(content)
        tool_calls = delta.get("tool_calls")
        if not isinstance(tool_calls, list):
            return None
        kept = []
        for call in tool_calls:
            if not isinstance(call, dict):
                continue
            state = self._call(call)
            function = call.get("function")
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                state.arguments.append(function["arguments"])
            if state.client_index is not None:
                kept.append({**call, "index": state.client_index})
        if kept:
            delta["tool_calls"] = kept
            return True
        del delta["tool_calls"]
        return bool(delta or choice.get("finish_reason") is not None)

    def _call(self, call: Json) -> _StreamedCall:
        index = call.get("index", 0)
        state = self._calls.get(index)
        if state is None:
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            state = _StreamedCall(str(call.get("id")), str(name))
            if name != self._tool:
                state.client_index = self._clients
                self._clients += 1
            self._calls[index] = state
        return state

    def continue_with(self, payload: Json, answered: list[tuple[Call, str]]) -> None:
        text = "".join(self._text)
        calls = [
            {"id": call.id, "type": "function",
             "function": {"name": self._tool, "arguments": call.arguments}}
            for call, _ in answered
        ]  # fmt: skip
        answer_calls(payload["messages"], text or None, calls, answered)
        self._prior = add_usage(self._prior, self._spent)

    def ending(self) -> bytes:
        if not self._holding:
            return b""
        parts = []
        finish = self._finish
        if finish is not None:
            choice = dict(finish["choices"][0])
            delta = {k: v for k, v in (choice.get("delta") or {}).items() if k != "tool_calls"}
            choice.update(delta=delta, finish_reason="stop")
            ended = {**finish, "choices": [choice]}
            if self._spent is not None and "usage" in finish:
                ended["usage"] = add_usage(self._prior, self._spent)
                parts.append(data_event(ended))
            else:
                parts.append(data_event(ended))
                if self._spent is not None:
                    usage = add_usage(self._prior, self._spent)
                    tail = {**finish, "choices": [], "usage": usage}
                    parts.append(data_event(tail))
        if self._done:
            parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)
