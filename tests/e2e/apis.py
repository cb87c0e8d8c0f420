"""Scripted fakes of the three APIs an agent talks to (chat completions, Responses, Anthropic
Messages), served on loopback behind the proxy, for the real clients of tests/e2e.

Each conversation is a tool loop: after the person's latest prompt the model calls the client's
shell tool `turns` times (each call prints a few thousand words, so the conversation grows past
the proxy's trigger), then answers `done`. Streamed or not, as the client asks. The proxy's own
summary calls (`X-Compaction-Purpose`) get a summary. Every request the proxy forwards for a
client is checked against its API's rules, and what the real API would refuse is collected in
`problems`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from bench.dialects import check_anthropic, check_responses, signature_of
from compaction import SUMMARY_MARKER
from compaction.invariants import check_tool_pairing
from proxy.dialects import is_injected
from proxy.http.serving import serve_on_loopback
from tests.fakes.script import MEMORY_TEXT, PURPOSE, SUMMARY_TEXT, body_tokens

DONE = "done: every step ran"


def shell_command(turn: int, lines: int) -> str:
    """What the model asks the client to run at `turn`: prints about `lines` x 6 words."""
    return f"yes 'turn {turn} alpha beta gamma delta' | head -n {lines} | tr '\\n' ' '"


def printed(command: dict[str, Any]) -> str:
    """What the shell prints for `shell_command` (an SDK test runs no shell)."""
    text = str(command.get("command", ""))
    turn = text.split("'turn ", 1)[1].split(" ", 1)[0] if "'turn " in text else "?"
    lines = int(text.split("head -n ", 1)[1].split(" ", 1)[0]) if "head -n " in text else 1
    return f"turn {turn} alpha beta gamma delta " * lines


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def purpose(self) -> str | None:
        return self.headers.get(PURPOSE)

    @property
    def answer(self) -> str:
        """What the proxy's own call is answered: a summary, or memory items."""
        return MEMORY_TEXT if self.purpose == "memory" else SUMMARY_TEXT


@dataclass
class ScriptedApis:
    turns: int = 6
    lines: int = 400
    received: list[Received] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    thoughts: dict[str, Any] = field(default_factory=dict)
    """Every thinking block seen, by signature: one altered later is a problem."""
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=1024**3)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count)
        self._runner, self.url = await serve_on_loopback(app)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def agent_requests(self, path: str) -> list[Received]:
        """What the proxy forwarded for its clients to `path` (its own calls left out)."""
        return [r for r in self.received if r.path == path and r.purpose is None]

    # -- the APIs ------------------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> Received:
        body = orjson.loads(await request.read())
        received = Received(request.path, dict(request.headers), body)
        self.received.append(received)
        return received

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _count(self, request: web.Request) -> web.Response:
        received = await self._receive(request)
        return web.json_response({"input_tokens": body_tokens("/messages", received.body)})

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        received = await self._receive(request)
        body = received.body
        if received.purpose is None:
            self._check("responses", check_responses(body))
        items = body.get("input") if isinstance(body.get("input"), list) else []
        done = _next_turn(items, _responses_role)
        output: list[dict[str, Any]]
        if received.purpose is not None:
            output = [_responses_message(received.answer)]
        elif done < self.turns and (call := self._responses_call(body, done)) is not None:
            output = [call]
        else:
            output = [_responses_message(DONE)]
        response = {
            "id": f"resp_{next(self._ids)}",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "completed",
            "model": body.get("model", "fake"),
            "output": output,
            "usage": _responses_usage(body_tokens("/responses", body)),
        }
        if not body.get("stream"):
            return web.json_response(response)
        return await _stream(request, _responses_events(response))

    def _responses_call(self, body: dict[str, Any], turn: int) -> dict[str, Any] | None:
        command = shell_command(turn, self.lines)
        names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if "shell" in names:
            arguments: dict[str, Any] = {"command": ["bash", "-lc", command]}
        elif "exec_command" in names:
            arguments = {"cmd": command}
        elif "shell_command" in names or "run" in names:
            arguments = {"command": command}
        else:
            return None
        name = next(n for n in ("shell", "exec_command", "shell_command", "run") if n in names)
        call_id = f"call_{next(self._ids)}"
        return {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": name,
            "arguments": orjson.dumps(arguments).decode(),
            "status": "completed",
        }

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        received = await self._receive(request)
        body = received.body
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        if received.purpose is None:
            self._check("chat", check_tool_pairing(messages))
        done = _next_turn(messages, _chat_role)
        names = {
            (t.get("function") or {}).get("name")
            for t in body.get("tools") or []
            if isinstance(t, dict)
        }
        message: dict[str, Any] = {"role": "assistant", "content": DONE}
        if received.purpose is not None:
            message = {"role": "assistant", "content": received.answer}
        elif done < self.turns and "run" in names:
            call = {
                "id": f"call_{next(self._ids)}",
                "type": "function",
                "function": {
                    "name": "run",
                    "arguments": orjson.dumps(
                        {"command": shell_command(done, self.lines)}
                    ).decode(),
                },
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        prompt = body_tokens("/chat/completions", body)
        usage = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
        finish = "tool_calls" if "tool_calls" in message else "stop"
        completion = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(completion)
        return await _stream(request, _chat_events(completion), named=False)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        received = await self._receive(request)
        body = received.body
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if received.purpose is None:
            self._check("anthropic", check_anthropic(body, self.thoughts))
        done = _next_turn(messages, _chat_role)
        content: list[dict[str, Any]] = [{"type": "text", "text": DONE}]
        if received.purpose is not None:
            content = [{"type": "text", "text": received.answer}]
        elif done < self.turns and (name := _anthropic_shell(tools)) is not None:
            command = {"command": shell_command(done, self.lines), "description": "print words"}
            use = {"type": "tool_use", "id": f"toolu_{next(self._ids)}", "name": name}
            content = [{**use, "input": command}]
        if received.purpose is None and isinstance(body.get("thinking"), dict):
            # Extended thinking: every answer opens with a signed thought, which the client
            # must send back untouched (check_anthropic refuses any other).
            thought = f"Turn {done} of the task; next: {content[0]['type']}."
            content = [
                {"type": "thinking", "thinking": thought, "signature": signature_of(thought)},
                *content,
            ]
        message = {
            "id": f"msg_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake"),
            "content": content,
            "stop_reason": "tool_use" if content[-1]["type"] == "tool_use" else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": body_tokens("/messages", body),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 5,
            },
        }
        if not body.get("stream"):
            return web.json_response(message)
        return await _stream(request, _anthropic_events(message))

    def _check(self, api: str, problems: list[str]) -> None:
        self.problems += [f"{api}: {p}" for p in problems]


def _responses_role(item: dict[str, Any]) -> str | None:
    if item.get("type", "message") != "message":
        return None
    return str(item.get("role"))


def _chat_role(message: dict[str, Any]) -> str | None:
    return str(message.get("role"))


_TURN = re.compile(r"turn (\d+) alpha")


def _next_turn(items: list[Any], role_of: Callable[[dict[str, Any]], str | None]) -> int:
    """The step the tool loop is at: one past the last step whose call or output follows the
    person's latest prompt (a summary, injected context and tool results are not prompts; the
    proxy may have folded earlier steps, the latest ones are always there)."""
    last = -1
    for item in reversed(items):
        if not isinstance(item, dict):
            continue
        text = orjson.dumps(item).decode()
        is_prompt = (
            role_of(item) == "user"
            and not is_injected(item.get("content"))
            and (SUMMARY_MARKER not in text or not _TURN.search(text))
        )
        if is_prompt and not _TURN.search(text):
            break
        last = max([last, *(int(n) for n in _TURN.findall(text))])
        if is_prompt:
            break
    return last + 1


def _anthropic_shell(tools: set[Any]) -> str | None:
    return next((n for n in ("Bash", "bash", "run") if n in tools), None)


def _responses_message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_fake",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _responses_usage(prompt: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + 5,
    }


def _responses_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    for index, item in enumerate(response["output"]):
        opened = {**item, "status": "in_progress"}
        if item["type"] == "message":
            opened["content"] = []
        events.append({"type": "response.output_item.added", "output_index": index, "item": opened})
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            empty = {**part, "text": ""}
            events += [
                {"type": "response.content_part.added", **where, "part": empty},
                {"type": "response.output_text.delta", **where, "delta": part["text"]},
                {"type": "response.output_text.done", **where, "text": part["text"]},
                {"type": "response.content_part.done", **where, "part": part},
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def _chat_events(completion: dict[str, Any]) -> list[dict[str, Any]]:
    message = completion["choices"][0]["message"]
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(message["tool_calls"])]
    finish = completion["choices"][0]["finish_reason"]
    return [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {**head, "choices": [], "usage": completion["usage"]},
    ]


def _anthropic_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        extra: list[dict[str, Any]] = []
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            extra = [{"type": "signature_delta", "signature": block["signature"]}]
        else:
            opened = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(block["input"]).decode(),
            }
        events += [
            {"type": "content_block_start", "index": index, "content_block": opened},
            *({"type": "content_block_delta", "index": index, "delta": d} for d in (delta, *extra)),
            {"type": "content_block_stop", "index": index},
        ]
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
    return events


async def _stream(
    request: web.Request, events: list[dict[str, Any]], *, named: bool = True
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        name = f"event: {event['type']}\n".encode() if named else b""
        await response.write(name + b"data: " + orjson.dumps(event) + b"\n\n")
    if not named:
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
