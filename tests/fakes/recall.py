"""A model that calls `recall` when it is offered, and a strict upstream check of the histories
it is sent, in the three dialects (whole responses).

`RecallingModel(query)` is a Script.chat reply: while the request carries the `recall` tool and
its history holds no answered recall call yet (or fewer than `calls` of them), it calls `recall`
with `query` (beside `also`, a call to a client tool, when given); once answered, it says
"recalled: <the last tool result>". Every request it gets is checked: every call answered, every
result answering a call made before it, ids matching; what a real API would refuse is collected
in `problems`.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.apis import (
    anthropic_events,
    anthropic_message,
    responses_object,
)
from tests.fakes.upstream import chat_completion

RECALL = "recall"
_ids = itertools.count(1)


def offers_recall(path: str, payload: dict[str, Any]) -> bool:
    for tool in payload.get("tools") or []:
        name = tool.get("function", {}).get("name") if "function" in tool else tool.get("name")
        if name == RECALL:
            return True
    return False


def results(path: str, payload: dict[str, Any]) -> list[str]:
    """The results of this model's own recall calls in the request's history, in order."""
    if path.endswith("/responses"):
        return [
            item["output"]
            for item in payload["input"]
            if isinstance(item, dict)
            and item.get("type") == "function_call_output"
            and item["call_id"].startswith("call_r")
        ]
    if path.endswith("/messages"):
        found = []
        for message in payload["messages"]:
            content = message.get("content")
            if isinstance(content, list):
                found += [
                    block["content"]
                    for block in content
                    if block.get("type") == "tool_result"
                    and block["tool_use_id"].startswith("toolu_r")
                ]
        return found
    return [
        m["content"]
        for m in payload["messages"]
        if m.get("role") == "tool" and m["tool_call_id"].startswith("call_r")
    ]


def check_pairing(path: str, payload: dict[str, Any]) -> list[str]:
    """What a strict API refuses: a call without its result, a result without its call."""
    problems: list[str] = []
    if path.endswith("/responses"):
        called: set[str] = set()
        answered: set[str] = set()
        for item in payload["input"]:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call":
                called.add(item["call_id"])
            elif item.get("type") == "function_call_output":
                if item["call_id"] not in called:
                    problems.append(f"output without call {item['call_id']}")
                answered.add(item["call_id"])
        problems += [f"call without output {c}" for c in sorted(called - answered)]
        return problems
    messages = payload["messages"]
    for i, message in enumerate(messages):
        if path.endswith("/messages"):
            content = message.get("content")
            if message.get("role") != "assistant" or not isinstance(content, list):
                continue
            ids = [b["id"] for b in content if b.get("type") == "tool_use"]
            following = messages[i + 1]["content"] if i + 1 < len(messages) else []
            got = [b.get("tool_use_id") for b in following if isinstance(b, dict)]
            if ids and sorted(got) != sorted(ids):
                problems.append(f"tool_use {ids} answered by {got}")
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            ids = [call["id"] for call in message["tool_calls"]]
            got = []
            for after in messages[i + 1 :]:
                if after.get("role") != "tool":
                    break
                got.append(after["tool_call_id"])
            if sorted(got) != sorted(ids):
                problems.append(f"tool_calls {ids} answered by {got}")
        elif message.get("role") == "tool":
            before = messages[i - 1] if i else {}
            if before.get("role") not in ("assistant", "tool"):
                problems.append(f"tool message without its call at {i}")
    return problems


class RecallingModel:
    def __init__(
        self,
        query: str,
        *,
        calls: int = 1,
        also: tuple[str, str] | None = None,
        reasoning: bool = False,
    ) -> None:
        """`reasoning`: each Responses answer opens with a reasoning item of its own."""
        self.query = query
        self.calls = calls
        self.also = also
        self.reasoning = reasoning
        self.problems: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        self.bodies.append(payload)
        self.problems += check_pairing(request.path, payload)
        found = results(request.path, payload)
        calling = offers_recall(request.path, payload) and len(found) < self.calls
        if payload.get("stream") is True:
            usage = (payload.get("stream_options") or {}).get("include_usage") is True
            if calling:
                events = self._call_events(request.path, len(found) + 1, usage)
            else:
                events = _text_events(request.path, _answer(found), usage, self.reasoning)
            return await _stream(request, events)
        if calling:
            return web.json_response(self._call(request.path, len(found) + 1))
        return web.json_response(_text(request.path, _answer(found), self.reasoning))

    def _anthropic_call_events(self, number: int) -> list[bytes]:
        start = {**anthropic_message(input_tokens=100), "stop_reason": None}
        start["usage"] = {**start["usage"], "output_tokens": 1}
        events: list[Any] = [
            {"type": "message_start", "message": start},
            {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "Let me check. "}},
            {"type": "content_block_stop", "index": 0},
        ]  # fmt: skip
        uses = [(f"toolu_r{number}", RECALL, orjson.dumps({"query": self.query}).decode())]
        uses += [
            (f"toolu_own{number}", name, args) for name, args in ([self.also] if self.also else [])
        ]
        for index, (use_id, name, args) in enumerate(uses, start=1):
            block = {"type": "tool_use", "id": use_id, "name": name, "input": {}}
            half = len(args) // 2
            events.append({"type": "content_block_start", "index": index, "content_block": block})
            for piece in (args[:half], args[half:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
            events.append({"type": "content_block_stop", "index": index})
        events += [
            {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
             "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]  # fmt: skip
        return [
            b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
            for e in events
        ]

    def _responses_call_events(self, number: int) -> list[bytes]:
        arguments = orjson.dumps({"query": self.query}).decode()
        own = [self.also] if self.also else []
        calls = [(f"call_r{number}", RECALL, arguments)]
        calls += [(f"call_own{number}", name, args) for name, args in own]
        # Reasoning straight into the call, as reasoning models do (no words before it).
        reasoning = f"enc-call-{number}" if self.reasoning else None
        text = "" if self.reasoning else "Let me check. "
        done = responses_object(text, calls=calls, reasoning=reasoning, input_tokens=100)
        return _responses_events(done)

    def _call_events(self, path: str, number: int, usage: bool) -> list[bytes]:
        if path.endswith("/messages"):
            return self._anthropic_call_events(number)
        if path.endswith("/responses"):
            return self._responses_call_events(number)
        if not path.endswith("/chat/completions"):
            raise NotImplementedError(path)
        arguments = orjson.dumps({"query": self.query}).decode()
        own = [self.also] if self.also else []
        chunks = [
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"content": "Let me check. "}),
        ]
        names = [(f"call_r{number}", RECALL, arguments)]
        names += [(f"call_own{number}", name, args) for name, args in own]
        for index, (call_id, name, args) in enumerate(names):
            start = {"index": index, "id": call_id, "type": "function",
                     "function": {"name": name, "arguments": ""}}  # fmt: skip
            chunks.append(_chunk({"tool_calls": [start]}))
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                chunks.append(_chunk(delta))
        chunks.append(_chunk({}, finish="tool_calls"))
        return _sse(chunks, usage)

    def _call(self, path: str, number: int) -> dict[str, Any]:
        arguments = orjson.dumps({"query": self.query}).decode()
        own = [self.also] if self.also else []
        if path.endswith("/responses"):
            calls = [(f"call_r{number}", RECALL, arguments)]
            calls += [(f"call_own{number}", name, args) for name, args in own]
            reasoning = f"enc-call-{number}" if self.reasoning else None
            return responses_object(calls=calls, reasoning=reasoning, input_tokens=100)
        if path.endswith("/messages"):
            uses = [(f"toolu_r{number}", RECALL, {"query": self.query})]
            uses += [(f"toolu_own{number}", name, orjson.loads(args)) for name, args in own]
            return anthropic_message(tool_uses=uses, input_tokens=100)
        tool_calls = [
            {"id": f"call_r{number}", "type": "function",
             "function": {"name": RECALL, "arguments": arguments}},
            *(
                {"id": f"call_own{number}", "type": "function",
                 "function": {"name": name, "arguments": args}}
                for name, args in own
            ),
        ]  # fmt: skip
        completion = chat_completion("", {"prompt_tokens": 100, "completion_tokens": 5,
                                          "total_tokens": 105})  # fmt: skip
        choice = completion["choices"][0]
        choice["message"] = {"role": "assistant", "content": None, "tool_calls": tool_calls}
        choice["finish_reason"] = "tool_calls"
        return completion


def _text(path: str, text: str, reasoning: bool = False) -> dict[str, Any]:
    if path.endswith("/responses"):
        return responses_object(
            text, reasoning="enc-answer" if reasoning else None, input_tokens=100
        )
    if path.endswith("/messages"):
        return anthropic_message(text, input_tokens=100)
    return chat_completion(text, {"prompt_tokens": 100, "completion_tokens": 5,
                                  "total_tokens": 105})  # fmt: skip


def _answer(found: list[str]) -> str:
    return f"recalled: {found[-1]}" if found else "nothing to recall"


def _chunk(delta: dict[str, Any], finish: str | None = None, ident: str = "chatcmpl-1") -> Any:
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _sse(chunks: list[Any], usage: bool) -> list[bytes]:
    # Every response of its own id (a real upstream's): the proxy shows the client one.
    ident = f"chatcmpl-{next(_ids)}"
    for chunk in chunks:
        chunk["id"] = ident
    if usage:
        counted = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
        chunks.append({**chunks[-1], "choices": [], "usage": counted})
    return [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]


def _text_events(path: str, text: str, usage: bool, reasoning: bool = False) -> list[bytes]:
    if path.endswith("/messages"):
        return anthropic_events(text, input_tokens=100)
    if path.endswith("/responses"):
        encrypted = "enc-answer" if reasoning else None
        return _responses_events(responses_object(text, reasoning=encrypted, input_tokens=100))
    if not path.endswith("/chat/completions"):
        raise NotImplementedError(path)
    half = len(text) // 2
    chunks = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": text[:half]}),
              _chunk({"content": text[half:]}), _chunk({}, finish="stop")]  # fmt: skip
    return _sse(chunks, usage)


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def _responses_events(done: dict[str, Any]) -> list[bytes]:
    """The events of a streamed Responses `done` (its ids made unique, as a real upstream's)."""
    number = next(_ids)
    done["id"] = f"resp_{number}"
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    events: list[Any] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(done["output"]):
        if item["type"] == "reasoning":
            item["id"] = f"rs_{number}_{index}"
            events.append(
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "encrypted_content": None}}
            )  # fmt: skip
        elif item["type"] == "message":
            item["id"] = f"msg_{number}"
            part = {"type": "output_text", "text": "", "annotations": []}
            text = item["content"][0]["text"]
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "content": []}},
                {"type": "response.content_part.added", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "part": part},
                {"type": "response.output_text.delta", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "delta": text, "logprobs": []},
                {"type": "response.content_part.done", "item_id": item["id"],
                 "output_index": index, "content_index": 0, "part": {**part, "text": text}},
            ]  # fmt: skip
        else:
            item["id"] = f"fc_{item['call_id']}"
            args = item["arguments"]
            half = len(args) // 2
            events.append(
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "arguments": ""}}
            )  # fmt: skip
            for piece in (args[:half], args[half:]):
                events.append(
                    {"type": "response.function_call_arguments.delta", "item_id": item["id"],
                     "output_index": index, "delta": piece}
                )  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": done})
    for sequence, event in enumerate(events):
        event["sequence_number"] = sequence
    return [
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    ]
