"""StrictResponses: a loopback Responses API that refuses, with the API's 400, what the real one
refuses in the requests a client (or the proxy in front of it) sends, as OpenAI documents it.

    async with StrictResponses(turn, window=40_000) as api:
        ... point the proxy's `upstream.base_url` at api.base_url (".../v1") ...
        api.refused          # what it answered 400, and why (an e2e run wants none)
        api.received         # every POST as it arrived: raw bytes, headers, parsed body

Refused, each as the docs state it:
- A `reasoning` item not followed by the item that followed it when the fake produced it (its
  function call, by `call_id`, or its message): "Item 'rs_…' of type 'reasoning' was provided
  without its required following item." Reasoning items go back to the model "exactly as
  received", each with the output item it led to (reasoning guide, "Keeping reasoning items in
  context": https://platform.openai.com/docs/guides/reasoning#keeping-reasoning-items-in-context;
  the cookbook https://cookbook.openai.com/examples/responses_api/reasoning_items; the error as
  the API words it, quoted in https://github.com/continuedev/continue/issues/8933). A reasoning
  item whose `encrypted_content` the fake did not issue cannot be decrypted, and is refused too.
- A `compaction` item the fake did not issue, or issued with other `encrypted_content`: "The
  returned compaction item ... is opaque and not intended to be human-interpretable"; it is
  passed back as it came (https://developers.openai.com/api/docs/guides/compaction).
- A function call without its output, or an output without its call (function calling guide,
  https://platform.openai.com/docs/guides/function-calling: "No tool output found for function
  call ...").
- A prompt past the model's context window (`window`, counted with the proxy's own estimator so
  the fake and the proxy agree on sizes), plus `max_output_tokens` when asked: the API's
  `context_length_exceeded` (conversation state guide, "Managing the context window":
  https://platform.openai.com/docs/guides/conversation-state#managing-the-context-window).
- Any GET on /v1/responses: a WebSocket is opened with `GET /v1/responses` and `Upgrade:
  websocket` (https://developers.openai.com/api/docs/guides/websocket-mode); a GET without its
  `Upgrade`/`Connection` headers (a half handshake a proxy forwarded) is no handshake, and this
  fake relays no sockets either: 400.

Answered, as the API does: a request whose last input item is `{"type": "compaction_trigger"}`
(Codex's remote compaction, the body form of POST /v1/responses/compact) with one `compaction`
item whose `encrypted_content` only this fake can read; every other agent request with what
`turn(payload)` returns (output items: reasoning items get their id and encrypted content here;
calls and messages their ids), streamed (SSE, as Codex reads it) or whole, as asked. The proxy's
own calls (`X-Compaction-Purpose`) are answered with a summary text and held to the same rules.
Usage reports what the proxy's estimator counts for the request as received.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.http.serving import serve_on_loopback
from tests.fakes.script import PURPOSE, SUMMARY_TEXT, body_tokens

Turn = Callable[[dict[str, Any]], list[dict[str, Any]]]
COMPACTION_TRIGGER = "compaction_trigger"
_FOLLOWING = "Item '{id}' of type 'reasoning' was provided without its required following item."


@dataclass
class Received:
    """One request as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any]

    @property
    def purpose(self) -> str | None:
        return self.headers.get(PURPOSE)

    @property
    def items(self) -> list[Any]:
        found = self.body.get("input")
        return found if isinstance(found, list) else []

    @property
    def is_compaction_trigger(self) -> bool:
        last = self.items[-1] if self.items else None
        return isinstance(last, dict) and last.get("type") == COMPACTION_TRIGGER


@dataclass
class Refusal:
    path: str
    purpose: str | None
    message: str


def say(text: str) -> dict[str, Any]:
    """An assistant message output item saying `text` (for a `turn`)."""
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A function call output item (for a `turn`; its ids are given by the fake)."""
    return {
        "type": "function_call",
        "status": "completed",
        "name": name,
        "arguments": orjson.dumps(arguments).decode(),
    }


REASONING: dict[str, Any] = {"type": "reasoning", "summary": []}
"""A reasoning item for a `turn` to put before the item it leads to."""


def reason_then_answer(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The default `turn`: a reasoning item, then "Done."."""
    return [REASONING, say("Done.")]


@dataclass
class StrictResponses:
    turn: Turn = reason_then_answer
    window: int = 200_000
    received: list[Received] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    compactions: dict[str, str] = field(default_factory=dict)
    """Every compaction item issued: its encrypted content, by id."""
    _reasoning: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Every reasoning item issued, by encrypted content: its id, and the key of the item that
    followed it."""
    _serial: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    base_url: str = ""

    async def __aenter__(self) -> StrictResponses:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/v1/responses", self._post)
        app.router.add_get("/v1/responses", self._get)
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        self._runner, url = await serve_on_loopback(app)
        self.base_url = f"{url}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def agent_requests(self) -> list[Received]:
        """The POSTs the proxy forwarded for its client (its own calls left out)."""
        return [r for r in self.received if r.method == "POST" and r.purpose is None]

    # serving ---------------------------------------------------------------------------------

    async def _get(self, request: web.Request) -> web.Response:
        self.received.append(Received("GET", request.path, _headers(request), b"", {}))
        upgrade = request.headers.get("Upgrade")
        message = (
            "WebSocket upgrade without its Connection: Upgrade (a half handshake)"
            if upgrade is None and "Sec-WebSocket-Key" in request.headers
            else f"GET {request.path} is not a WebSocket handshake this server accepts"
        )
        return self._refuse(request.path, None, message)

    async def _elsewhere(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.received.append(Received(request.method, request.path, _headers(request), raw, {}))
        return self._refuse(request.path, None, f"{request.method} {request.path}: not served")

    async def _post(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        payload = orjson.loads(raw)
        received = Received("POST", request.path, _headers(request), raw, payload)
        self.received.append(received)
        problem = self._check(payload)
        if problem is not None:
            return self._refuse(request.path, received.purpose, problem)
        if received.purpose is not None:
            output = self._issue([say(SUMMARY_TEXT)])
        elif received.is_compaction_trigger:
            output = [self._compaction()]
        else:
            output = self._issue(self.turn(payload))
        response = {
            "id": f"resp_{next(self._serial)}",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "completed",
            "model": payload.get("model"),
            "output": output,
            "usage": _usage(body_tokens("/responses", payload)),
        }
        if payload.get("stream") is True:
            return await _stream(request, response)
        return web.json_response(response)

    def _refuse(self, path: str, purpose: str | None, message: str) -> web.Response:
        self.refused.append(Refusal(path, purpose, message))
        error = {"message": message, "type": "invalid_request_error", "param": "input"}
        return web.json_response({"error": {**error, "code": None}}, status=400)

    # the rules -------------------------------------------------------------------------------

    def _check(self, payload: dict[str, Any]) -> str | None:
        items = payload.get("input")
        if not isinstance(items, list):
            return None
        prompt = body_tokens("/responses", payload)
        asked = payload.get("max_output_tokens")
        needed = prompt + (asked if isinstance(asked, int) else 0)
        if needed > self.window:
            return (
                f"Your input exceeds the context window of this model ({needed} > "
                f"{self.window} tokens). Please adjust your input and try again."
            )
        called: set[str] = set()
        for index, item in enumerate(items):
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind == "reasoning":
                problem = self._reasoning_problem(item, items[index + 1 : index + 2])
            elif kind == "compaction":
                problem = self._compaction_problem(item)
            elif kind == "function_call":
                called.add(str(item.get("call_id")))
                problem = None
            elif kind == "function_call_output" and item.get("call_id") not in called:
                problem = f"No tool call found for function call output with call_id {item.get('call_id')}."
            else:
                problem = None
            if problem is not None:
                return f"input[{index}]: {problem}"
        answered = {
            i.get("call_id")
            for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        }
        for call_id in called - answered:
            return f"No tool output found for function call {call_id}."
        return None

    def _reasoning_problem(self, item: dict[str, Any], after: list[Any]) -> str | None:
        issued = self._reasoning.get(str(item.get("encrypted_content")))
        if issued is None:
            return "The encrypted content for a reasoning item could not be verified."
        reasoning_id, following = issued
        if not after or _key(after[0]) != following:
            return _FOLLOWING.format(id=reasoning_id)
        return None

    def _compaction_problem(self, item: dict[str, Any]) -> str | None:
        content = item.get("encrypted_content")
        known = self.compactions.get(str(item.get("id"))) if "id" in item else None
        if content not in self.compactions.values() or (known is not None and known != content):
            return "The encrypted content for a compaction item could not be verified."
        return None

    # answers ---------------------------------------------------------------------------------

    def _issue(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`output` with ids given, each reasoning item's encrypted content issued and bound to
        the item after it."""
        given: list[dict[str, Any]] = []
        for item in output:
            serial = next(self._serial)
            if item["type"] == "function_call":
                item = {"id": f"fc_{serial}", "call_id": f"call_{serial}", **item}
            elif item["type"] == "message":
                item = {"id": f"msg_{serial}", **item}
            elif item["type"] == "reasoning":
                item = {"id": f"rs_{serial}", "encrypted_content": _opaque("rs", serial), **item}
            given.append(item)
        for index, item in enumerate(given):
            if item["type"] == "reasoning":
                following = _key(given[index + 1]) if index + 1 < len(given) else "nothing"
                self._reasoning[item["encrypted_content"]] = (item["id"], following)
        return given

    def _compaction(self) -> dict[str, Any]:
        serial = next(self._serial)
        item = {
            "type": "compaction",
            "id": f"cmp_{serial}",
            "encrypted_content": _opaque("cmp", serial),
        }
        self.compactions[item["id"]] = item["encrypted_content"]
        return item


def _key(item: Any) -> str:
    """What identifies an output item a reasoning item must be followed by."""
    if not isinstance(item, dict):
        return "?"
    kind = str(item.get("type", "message"))
    if kind == "message":
        return f"message:{item.get('role')}"
    if kind.endswith("_call"):
        return f"{kind}:{item.get('call_id')}"
    return kind


def _opaque(kind: str, serial: int) -> str:
    """Encrypted content only this fake can read (no client can make it up)."""
    return "gAAAAB" + hashlib.sha256(f"{kind}-{serial}".encode()).hexdigest() * 2


def _usage(prompt: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 10},
        "total_tokens": prompt + 20,
    }


async def _stream(request: web.Request, response: dict[str, Any]) -> web.StreamResponse:
    """The response as the API streams it: created, each item added and done (a message's text
    in one delta between), completed."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    for index, item in enumerate(response["output"]):
        opened = {**item, "content": []} if item["type"] == "message" else item
        events.append({"type": "response.output_item.added", "output_index": index, "item": opened})
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **where, "delta": part["text"]},
                {"type": "response.output_text.done", **where, "text": part["text"]},
                {"type": "response.content_part.done", **where, "part": part},
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await stream.prepare(request)
    for number, event in enumerate(events):
        data = orjson.dumps({**event, "sequence_number": number})
        await stream.write(b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n")
    await stream.write_eof()
    return stream


def _headers(request: web.Request) -> dict[str, str]:
    return {str(name): value for name, value in request.headers.items()}
