"""An Anthropic message streamed as events (`message_start`, content blocks: start, deltas, stop;
`message_delta`, `message_stop`), across the rounds that answer the proxy's tool: the tool's
`tool_use` block's events are dropped, later blocks renumbered; a round's `message_start` is
withheld (one message), and so are a round's thinking blocks (written after a call and result
the client never sees, they would come back bound to a different conversation);
`message_stop` once; usage summed over the rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from proxy.dialects.anthropic.recall import Json, answer_calls, is_thinking, is_tool_call
from proxy.dialects.base import Call
from proxy.dialects.events import StreamReader, named_event, typed_payload
from proxy.dialects.usage import add_usage

_BLOCK_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop")


@dataclass
class _Block:
    block: Json
    """The content block as it started; its deltas are added into it as they come."""
    client_index: int | None
    """Its index as the client sees it (None: a call of the proxy's tool, never shown)."""
    json: list[str] = field(default_factory=list)


class AnthropicStream(StreamReader):
    """An Anthropic message streamed as events. A round's message continues the first: its
    `message_start` is withheld and its blocks numbered after those already shown."""

    def __init__(self, tool: str) -> None:
        self._started = False
        self._round = False
        """A round's response is being read (the first response's came before it)."""
        self._shown = 0
        """Blocks shown to the client by the rounds before this response."""
        super().__init__(tool)

    def begin(self) -> None:
        super().begin()
        self._blocks: dict[int, _Block] = {}
        self._shown_now = 0
        self._finish: Json | None = None
        self._stopped = False

    @property
    def recall(self) -> list[Call]:
        return [
            Call(str(b.block.get("id")), _json_input(b)) for b in self._blocks.values()
            if b.client_index is None and is_tool_call(b.block)
        ]  # fmt: skip

    def read(self, event: bytes) -> bytes | None:
        payload = typed_payload(event)
        if payload is None:
            return event
        kind = payload["type"]
        if kind == "message_start":
            return self._read_start(event, payload)
        if kind in _BLOCK_EVENTS:
            return self._read_block(event, payload)
        if kind == "message_delta":
            return self._read_delta(event, payload)
        if kind == "message_stop" and self._holding:
            self._stopped = True
            return None
        return event

    def _read_start(self, event: bytes, payload: Json) -> bytes | None:
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
        self._spent = add_usage(self._spent, usage)
        if self._started:
            return None  # a round's message continues the one the client already has
        self._started = True
        self._first_usage = usage
        return event

    def _read_block(self, event: bytes, payload: Json) -> bytes | None:
        index = payload.get("index")
        if not isinstance(index, int):
            return event
        if payload["type"] == "content_block_start":
            block = payload.get("content_block")
            block = dict(block) if isinstance(block, dict) else {}
            recall = block.get("type") == "tool_use" and block.get("name") == self._tool
            # A round's thinking was written after a call and result the client never sees:
            # bound to that prefix, it would come back bound to a different conversation.
            withheld = recall or (self._round and is_thinking(block))
            shown = None if withheld else self._shown + self._shown_now
            if not withheld:
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
        return named_event(payload["type"], {**payload, "index": state.client_index})

    def _read_delta(self, event: bytes, payload: Json) -> bytes | None:
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
        return named_event(
            "message_delta", {**payload, "usage": add_usage(self._prior, self._spent)}
        )

    def continue_with(self, payload: Json, answered: list[tuple[Call, str]]) -> None:
        content = [_finished(b) for _, b in sorted(self._blocks.items())]
        answer_calls(payload["messages"], content, answered)
        self._prior = add_usage(self._prior, self._spent)
        self._shown += self._shown_now
        self._round = True

    def ending(self) -> bytes:
        if not self._holding or self._finish is None:
            return b""
        finish = self._finish
        delta = {**finish.get("delta", {}), "stop_reason": "end_turn"}
        ended: Json = {**finish, "delta": delta}
        if self._prior is not None and isinstance(finish.get("usage"), dict):
            ended["usage"] = add_usage(self._prior, self._spent)
        parts = [named_event("message_delta", ended)]
        if self._stopped:
            parts.append(named_event("message_stop", {"type": "message_stop"}))
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


def _finished(state: _Block) -> Json:
    """The block as the assistant turn holds it once its stream is over."""
    block = dict(state.block)
    if block.get("type") in ("tool_use", "server_tool_use"):
        block["input"] = _json_input(state)
    return block
