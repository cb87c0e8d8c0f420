"""Streamed responses that call `recall`, event by event, per dialect: what goes to the client at
once, what is withheld (the recall call's events, and the finish of a response that only called
recall), and how the next upstream response continues the same stream.

A `StreamedTurn` reads one upstream response's server-sent events (`read` gives the bytes the
client gets now, None to withhold); when the upstream's stream ends, `recall` and `others` say
what it called. If a round follows, `continue_with` appends the turn and the answers to the
request and `begin` readies the turn for the next response; if not, `ending` is what the client
still needs to see its stream end well (the withheld finish, usage summed over the rounds, the
end marker).

- chat: `chat.completion.chunk`s; the recall call's `tool_calls` deltas are dropped, the client's
  calls renumbered; every chunk carries the first response's `id`; `[DONE]` once.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.recall.tools import NAME
from proxy.recall.turns import Call, JsonObject, add_usage

_DATA = b"data:"


async def read_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The server-sent events of a body as they arrive, each with its blank-line end."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\r" in pending:
            pending = pending.replace(b"\r\n", b"\n")
        while True:
            end = pending.find(b"\n\n")
            if end < 0:
                break
            yield pending[: end + 2]
            pending = pending[end + 2 :]
    if pending.strip():
        yield pending if pending.endswith(b"\n\n") else pending.rstrip(b"\n") + b"\n\n"


def event_data(event: bytes) -> bytes | None:
    """The `data` of an event (its lines joined), None when it has none."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(_DATA)]
    return b"\n".join(lines) if lines else None


class StreamedTurn(Protocol):
    @property
    def recall(self) -> list[Call]: ...

    @property
    def others(self) -> int: ...

    @property
    def usage(self) -> object:
        """The first response's usage (calibration), None until seen."""
        ...

    def read(self, event: bytes) -> bytes | None: ...

    def begin(self) -> None: ...

    def continue_with(self, payload: JsonObject, answered: list[tuple[Call, str]]) -> None: ...

    def ending(self) -> bytes: ...


@dataclass
class _StreamedCall:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)
    client_index: int | None = None
    """Its index as the client sees it (None: a recall call, never shown)."""


class ChatStream:
    """A chat completion streamed as `chat.completion.chunk`s."""

    def __init__(self) -> None:
        self._id: object = None
        self._first_usage: object = None
        self._prior: object = None
        """Usage of the rounds before this response (added to the one the client sees)."""
        self.begin()

    def begin(self) -> None:
        self._calls: dict[int, _StreamedCall] = {}
        self._text: list[str] = []
        self._holding = False
        self._finish: JsonObject | None = None
        self._usage: object = None
        self._done = False
        self._clients = 0

    @property
    def recall(self) -> list[Call]:
        return [
            Call(call.id, "".join(call.arguments))
            for call in self._calls.values()
            if call.client_index is None
        ]

    @property
    def others(self) -> int:
        return self._clients

    @property
    def usage(self) -> object:
        return self._first_usage

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

    def _read_chunk(self, event: bytes, chunk: JsonObject) -> bytes | None:
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
            self._usage = add_usage(self._usage, usage)
            if self._prior is not None:
                chunk["usage"] = add_usage(self._prior, usage)
                changed = True
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and len(choices) == 1 else None
        if self._holding:
            return None  # after a finish that only called recall: usage and the like wait
        if isinstance(choice, dict):
            kept = self._read_choice(choice)
            if kept is False:
                return None
            changed = changed or kept is True
            if choice.get("finish_reason") == "tool_calls" and self.recall and not self._clients:
                self._holding, self._finish = True, chunk
                return None
        return b"data: " + orjson.dumps(chunk) + b"\n\n" if changed else event

    def _read_choice(self, choice: JsonObject) -> bool | None:
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

    def _call(self, call: JsonObject) -> _StreamedCall:
        index = call.get("index", 0)
        state = self._calls.get(index)
        if state is None:
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            state = _StreamedCall(str(call.get("id")), str(name))
            if name != NAME:
                state.client_index = self._clients
                self._clients += 1
            self._calls[index] = state
        return state

    def continue_with(self, payload: JsonObject, answered: list[tuple[Call, str]]) -> None:
        text = "".join(self._text)
        calls = [
            {"id": call.id, "type": "function",
             "function": {"name": NAME, "arguments": call.arguments}}
            for call, _ in answered
        ]  # fmt: skip
        messages = payload["messages"]
        messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        for call, result in answered:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        self._prior = add_usage(self._prior, self._usage)

    def ending(self) -> bytes:
        if not self._holding:
            return b""
        parts = []
        finish = self._finish
        if finish is not None:
            choice: Any = dict(finish["choices"][0])
            delta = {k: v for k, v in (choice.get("delta") or {}).items() if k != "tool_calls"}
            choice.update(delta=delta, finish_reason="stop")
            ended = {**finish, "choices": [choice]}
            if self._usage is not None and "usage" in finish:
                ended["usage"] = add_usage(self._prior, self._usage)
                parts.append(b"data: " + orjson.dumps(ended) + b"\n\n")
            else:
                parts.append(b"data: " + orjson.dumps(ended) + b"\n\n")
                if self._usage is not None:
                    usage = add_usage(self._prior, self._usage)
                    tail = {**finish, "choices": [], "usage": usage}
                    parts.append(b"data: " + orjson.dumps(tail) + b"\n\n")
        if self._done:
            parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)


def stream_for(dialect: str) -> StreamedTurn | None:
    """A fresh turn reader for a streamed response of `dialect`; None: not supported (such
    requests go out without the recall tool)."""
    if dialect == "chat":
        return ChatStream()
    return None
