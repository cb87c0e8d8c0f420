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
- anthropic: content blocks; the recall `tool_use` block's events are dropped, later blocks
  renumbered; a round's `message_start` is withheld (one message); `message_stop` once.
- responses: events with `sequence_number` and `output_index`; the recall call's item events are
  dropped, later items renumbered, one sequence; a round's `response.created` is withheld; the
  terminal event tells the whole response (every item shown, the first's id).
- usage: what the client is finally told is the sum over the rounds.
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


def typed_payload(event: bytes) -> JsonObject | None:
    """An event's data as a JSON object with a string `type` (Responses and Anthropic events);
    None for anything else, which the readers pass on untouched."""
    data = event_data(event)
    if data is None:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("type"), str) else None


class StreamedTurn(Protocol):
    @property
    def recall(self) -> list[Call]: ...

    @property
    def others(self) -> int: ...

    @property
    def usage(self) -> object:
        """The first response's usage (calibration), None until seen."""
        ...

    @property
    def spent(self) -> object:
        """The usage of the response being read (a round's cost), None until seen."""
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


class _Reader:
    """What the three readers keep alike: the first response's usage, the usage of the rounds
    before the response being read and of that response, and per response the client's own
    calls counted and whether its finish is withheld."""

    def __init__(self) -> None:
        self._first_usage: object = None
        self._prior: object = None
        """Usage of the rounds before this response (added to the one the client sees)."""
        self.begin()

    def begin(self) -> None:
        self._clients = 0
        self._spent: object = None
        self._holding = False

    @property
    def others(self) -> int:
        return self._clients

    @property
    def usage(self) -> object:
        return self._first_usage

    @property
    def spent(self) -> object:
        return self._spent


class ChatStream(_Reader):
    """A chat completion streamed as `chat.completion.chunk`s."""

    def __init__(self) -> None:
        self._id: object = None
        super().__init__()

    def begin(self) -> None:
        super().begin()
        self._calls: dict[int, _StreamedCall] = {}
        self._text: list[str] = []
        self._finish: JsonObject | None = None
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
            self._spent = add_usage(self._spent, usage)
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
        self._prior = add_usage(self._prior, self._spent)

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
            if self._spent is not None and "usage" in finish:
                ended["usage"] = add_usage(self._prior, self._spent)
                parts.append(b"data: " + orjson.dumps(ended) + b"\n\n")
            else:
                parts.append(b"data: " + orjson.dumps(ended) + b"\n\n")
                if self._spent is not None:
                    usage = add_usage(self._prior, self._spent)
                    tail = {**finish, "choices": [], "usage": usage}
                    parts.append(b"data: " + orjson.dumps(tail) + b"\n\n")
        if self._done:
            parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)


@dataclass
class _Block:
    block: JsonObject
    """The content block as it started; its deltas are added into it as they come."""
    client_index: int | None
    """Its index as the client sees it (None: a recall call, never shown)."""
    json: list[str] = field(default_factory=list)


class AnthropicStream(_Reader):
    """An Anthropic message streamed as events: `message_start`, content blocks (start, deltas,
    stop), `message_delta`, `message_stop`. A round's message continues the first: its
    `message_start` is withheld and its blocks numbered after those already shown."""

    def __init__(self) -> None:
        self._started = False
        self._shown = 0
        """Blocks shown to the client by the rounds before this response."""
        super().__init__()

    def begin(self) -> None:
        super().begin()
        self._blocks: dict[int, _Block] = {}
        self._shown_now = 0
        self._finish: JsonObject | None = None
        self._stopped = False

    @property
    def recall(self) -> list[Call]:
        return [
            Call(str(b.block.get("id")), _json_input(b)) for b in self._blocks.values()
            if b.client_index is None
        ]  # fmt: skip

    def read(self, event: bytes) -> bytes | None:
        payload = typed_payload(event)
        if payload is None:
            return event
        kind = payload["type"]
        if kind == "message_start":
            return self._read_start(event, payload)
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return self._read_block(event, payload)
        if kind == "message_delta":
            return self._read_delta(event, payload)
        if kind == "message_stop" and self._holding:
            self._stopped = True
            return None
        return event

    def _read_start(self, event: bytes, payload: JsonObject) -> bytes | None:
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
        self._spent = add_usage(self._spent, usage)
        if self._started:
            return None  # a round's message continues the one the client already has
        self._started = True
        self._first_usage = usage
        return event

    def _read_block(self, event: bytes, payload: JsonObject) -> bytes | None:
        index = payload.get("index")
        if not isinstance(index, int):
            return event
        if payload["type"] == "content_block_start":
            block = payload.get("content_block")
            block = dict(block) if isinstance(block, dict) else {}
            recall = block.get("type") == "tool_use" and block.get("name") == NAME
            shown = None if recall else self._shown + self._shown_now
            if not recall:
                self._shown_now += 1
                if block.get("type") == "tool_use":
                    self._clients += 1
            self._blocks[index] = _Block(block, shown)
        state = self._blocks.get(index)
        if state is None:
            return event
        if payload["type"] == "content_block_delta":
            _add_delta(state, payload.get("delta"))
        if state.client_index is None:
            return None
        if state.client_index == index:
            return event
        return _event(payload["type"], {**payload, "index": state.client_index})

    def _read_delta(self, event: bytes, payload: JsonObject) -> bytes | None:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            # A message's counts so far: they replace its start's.
            start = self._spent if isinstance(self._spent, dict) else {}
            self._spent = {**start, **usage}
        delta = payload.get("delta")
        stop = delta.get("stop_reason") if isinstance(delta, dict) else None
        if stop == "tool_use" and self.recall and not self._clients:
            self._holding, self._finish = True, payload
            return None
        if self._prior is None or not isinstance(usage, dict):
            return event
        return _event("message_delta", {**payload, "usage": add_usage(self._prior, self._spent)})

    def continue_with(self, payload: JsonObject, answered: list[tuple[Call, str]]) -> None:
        content = [_finished(b) for _, b in sorted(self._blocks.items())]
        messages = payload["messages"]
        messages.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": call.id, "content": result}
            for call, result in answered
        ]
        messages.append({"role": "user", "content": results})
        self._prior = add_usage(self._prior, self._spent)
        self._shown += self._shown_now

    def ending(self) -> bytes:
        if not self._holding or self._finish is None:
            return b""
        finish = self._finish
        delta = {**finish.get("delta", {}), "stop_reason": "end_turn"}
        ended: JsonObject = {**finish, "delta": delta}
        if self._prior is not None and isinstance(finish.get("usage"), dict):
            ended["usage"] = add_usage(self._prior, self._spent)
        parts = [_event("message_delta", ended)]
        if self._stopped:
            parts.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(parts)


def _add_delta(state: _Block, delta: object) -> None:
    if not isinstance(delta, dict):
        return
    block = state.block
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
    elif kind == "input_json_delta":
        state.json.append(str(delta.get("partial_json", "")))


def _json_input(state: _Block) -> object:
    text = "".join(state.json)
    if not text:
        return state.block.get("input") or {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}


def _finished(state: _Block) -> JsonObject:
    """The block as the assistant turn holds it once its stream is over."""
    block = dict(state.block)
    if block.get("type") in ("tool_use", "server_tool_use"):
        block["input"] = _json_input(state)
    return block


_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class ResponsesStream(_Reader):
    """A Responses API response streamed as events, each with its `sequence_number` and most
    with an `output_index`. A round's response continues the first: its `response.created` and
    `response.in_progress` are withheld, its items numbered after those already shown, every
    event renumbered in one sequence, and the terminal event tells the whole response (the
    first's id, every item shown, usage summed)."""

    def __init__(self) -> None:
        self._id: object = None
        self._sequence = 0
        self._items: list[JsonObject] = []
        """The items shown to the client so far, as done."""
        self._shown = 0
        self._round = 0
        super().__init__()

    def begin(self) -> None:
        super().begin()
        self._indices: dict[int, int | None] = {}
        self._shown_now = 0
        self._final: JsonObject | None = None
        self._output: list[JsonObject] = []

    @property
    def recall(self) -> list[Call]:
        return [
            Call(str(item.get("call_id")), item.get("arguments"))
            for item in self._output
            if item.get("type") == "function_call" and item.get("name") == NAME
        ]

    def read(self, event: bytes) -> bytes | None:
        payload = typed_payload(event)
        if payload is None:
            return event
        kind = payload["type"]
        if kind in ("response.created", "response.in_progress", "response.queued"):
            if self._round:
                return None
            response = payload.get("response")
            if isinstance(response, dict) and self._id is None:
                self._id = response.get("id")
            return self._renumbered(event, payload, changed=False)
        if kind in _TERMINAL:
            return self._read_end(event, payload)
        index = payload.get("output_index")
        changed = False
        if isinstance(index, int):
            shown = self._index(index, payload)
            if shown is None:
                return None
            if shown != index:
                payload["output_index"] = shown
                changed = True
            if kind == "response.output_item.done" and isinstance(payload.get("item"), dict):
                self._output.append(payload["item"])
                self._items.append(payload["item"])
        return self._renumbered(event, payload, changed=changed)

    def _index(self, index: int, payload: JsonObject) -> int | None:
        """The client's index of the upstream's item `index` (None: a recall call's)."""
        if index not in self._indices:
            item = payload.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                if item.get("name") == NAME:
                    self._indices[index] = None
                    return None
                self._clients += 1
            self._indices[index] = self._shown + self._shown_now
            self._shown_now += 1
        return self._indices[index]

    def _read_end(self, event: bytes, payload: JsonObject) -> bytes | None:
        response = payload.get("response")
        if not isinstance(response, dict):
            return self._renumbered(event, payload, changed=False)
        self._spent = response.get("usage")
        if self._first_usage is None:
            self._first_usage = self._spent
        # Its own output as the upstream completed it (reasoning items' encrypted content too).
        output = response.get("output")
        if isinstance(output, list):
            self._output = [item for item in output if isinstance(item, dict)]
        if self.recall and not self._clients and payload["type"] == "response.completed":
            self._holding, self._final = True, payload
            return None
        if not self._round and not self.recall:
            return self._renumbered(event, payload, changed=False)
        return self._ended(payload)

    def _ended(self, payload: JsonObject) -> bytes:
        response = dict(payload["response"])
        response["output"] = [item for item in self._items if not _is_recall_item(item)]
        if self._id is not None:
            response["id"] = self._id
        if self._prior is not None:
            response["usage"] = add_usage(self._prior, response.get("usage"))
        return self._renumbered(b"", {**payload, "response": response}, changed=True) or b""

    def _renumbered(self, event: bytes, payload: JsonObject, *, changed: bool) -> bytes | None:
        if "sequence_number" in payload:
            if payload["sequence_number"] != self._sequence:
                payload["sequence_number"] = self._sequence
                changed = True
            self._sequence += 1
        return _event(str(payload["type"]), payload) if changed else event

    def continue_with(self, payload: JsonObject, answered: list[tuple[Call, str]]) -> None:
        items = payload["input"]
        items.extend(self._output)
        for call, result in answered:
            items.append({"type": "function_call_output", "call_id": call.id, "output": result})
        final = self._final.get("response") if self._final else None
        self._prior = add_usage(
            self._prior, final.get("usage") if isinstance(final, dict) else None
        )
        self._shown += self._shown_now
        self._round += 1

    def ending(self) -> bytes:
        if not self._holding or self._final is None:
            return b""
        return self._ended(self._final)


def _is_recall_item(item: JsonObject) -> bool:
    return item.get("type") == "function_call" and item.get("name") == NAME


def _event(name: str, payload: JsonObject) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def stream_for(dialect: str) -> StreamedTurn | None:
    """A fresh turn reader for a streamed response of `dialect`; None: not supported (such
    requests go out without the recall tool)."""
    if dialect == "chat":
        return ChatStream()
    if dialect == "anthropic":
        return AnthropicStream()
    if dialect == "responses":
        return ResponsesStream()
    return None
