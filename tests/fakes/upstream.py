"""FakeUpstream: a real OpenAI-compatible HTTP server on loopback, scripted per test.

    async with FakeUpstream() as upstream:          # listens on 127.0.0.1:<free port>
        upstream.reply(json_reply({"id": "x"}))     # how to answer (default: a chat completion)
        ... point the proxy at upstream.base_url (".../v1") ...
        upstream.requests[-1].body                  # exactly the bytes the proxy sent

Every request is recorded (`Recorded`: method, path, raw path, raw query, headers, raw body)
before the scripted reply runs. Replies are plain `async (request, upstream) -> response`
functions; the factories below cover the usual cases:

- `json_reply(payload, status=200, headers=None)` / `raw_reply(body, status, headers)`
- `chat_reply(content, usage=...)`: a minimal chat.completion
- `stream_reply(steps, cut=False)`: a chunked stream (SSE by default). A step is bytes (sent as
  one chunk), a float (sleep that many seconds), or an `asyncio.Event` (wait for it, so a test
  can hold the second chunk until it has seen the first). `cut=True` aborts the connection after
  the last step, without the terminating chunk: an upstream dying mid-stream.
- `sse_events(*payloads)`: `data: <json>\\n\\n` chunks plus `data: [DONE]`, for `stream_reply`
- `hang_reply()`: never answers (until the connection goes away)
- `strict_alternation(reply)`: like a backend whose chat template requires user and assistant
  turns to alternate (several vLLM / llama.cpp models): a chat body with two user or two
  assistant messages in a row (tool results aside), or whose first turn after the system
  messages is not the user's, gets a 400; anything else goes to `reply`

Side channels for assertions: `chunks_sent` (stream chunks written), `disconnected` (an Event set
when the peer closed the connection while a reply was still writing or waiting), `replies`
(a per-request list of replies, consumed in order before falling back to the default).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.http.serving import serve_on_loopback

Reply = Callable[[web.Request, "FakeUpstream"], Awaitable[web.StreamResponse]]
Step = bytes | float | asyncio.Event


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    raw_path: str
    query_string: str  # raw, still percent-encoded
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class FakeUpstream:
    def __init__(self, default: Reply | None = None) -> None:
        self.requests: list[Recorded] = []
        self.replies: list[Reply] = []
        self.default: Reply = default if default is not None else chat_reply("hello")
        self.chunks_sent = 0
        self.disconnected = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0

    # lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        # Bodies recorded as sent: aiohttp's server would decode a gzip/br/zstd body first.
        app = web.Application(client_max_size=1024**3, handler_args={"auto_decompress": False})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, _ = await serve_on_loopback(app)
        self._port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        """What `upstream.base_url` should be set to."""
        return f"{self.url}/v1"

    # scripting -------------------------------------------------------------------------------

    def reply(self, reply: Reply) -> None:
        """Answer every following request with `reply`."""
        self.default = reply

    def reply_once(self, *replies: Reply) -> None:
        """Answer the next requests with `replies`, in order, then with the default."""
        self.replies.extend(replies)

    # serving ---------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(
                method=request.method,
                path=request.path,
                raw_path=request.rel_url.raw_path,
                query_string=request.rel_url.raw_query_string,
                headers=request.headers,
                body=body,
            )
        )
        reply = self.replies.pop(0) if self.replies else self.default
        try:
            return await reply(request, self)
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnected.set()
            raise


# reply factories -----------------------------------------------------------------------------


def raw_reply(
    body: bytes,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> Reply:
    async def answer(request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        response = web.Response(status=status, body=body, headers=CIMultiDict(headers or {}))
        if "Content-Type" not in response.headers:
            response.headers["Content-Type"] = content_type
        return response

    return answer


def json_reply(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    return raw_reply(orjson.dumps(payload), status=status, headers=headers)


def chat_completion(content: str, usage: Mapping[str, int] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": dict(usage)
        if usage is not None
        else {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def chat_reply(content: str, usage: Mapping[str, int] | None = None) -> Reply:
    return json_reply(chat_completion(content, usage))


def chat_chunk(content: str | None, *, finish: bool = False, usage: Any = None) -> dict[str, Any]:
    choices = (
        []
        if content is None and not finish
        else [
            {
                "index": 0,
                "delta": {} if content is None else {"content": content},
                "finish_reason": "stop" if finish else None,
            }
        ]
    )
    chunk: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake-model",
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def sse_events(*payloads: Any, done: bool = True) -> list[bytes]:
    chunks = [b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads]
    if done:
        chunks.append(b"data: [DONE]\n\n")
    return chunks


def stream_reply(
    steps: Iterable[Step],
    *,
    status: int = 200,
    content_type: str = "text/event-stream",
    headers: Mapping[str, str] | None = None,
    cut: bool = False,
) -> Reply:
    script: Sequence[Step] = list(steps)

    async def answer(request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers=CIMultiDict(headers or {}))
        response.headers["Content-Type"] = content_type
        response.headers.setdefault("Cache-Control", "no-cache")
        response.enable_chunked_encoding()
        await response.prepare(request)
        for step in script:
            if isinstance(step, asyncio.Event):
                await step.wait()
            elif isinstance(step, (int, float)):
                await asyncio.sleep(step)
            else:
                await response.write(step)
                upstream.chunks_sent += 1
        if cut:
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write_eof()
        return response

    return answer


def hang_reply() -> Reply:
    async def answer(request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return answer


def alternation_problem(messages: Any) -> str | None:
    """Why a strict chat template would refuse `messages`; None when roles alternate. Tool
    results belong to the assistant turn that called them: assistant, tool, assistant is fine."""
    listed = messages if isinstance(messages, list) else []
    roles = [m.get("role") for m in listed if isinstance(m, dict)]
    turns = [r for r in roles if r not in ("system", "developer")]
    if turns and turns[0] != "user":
        return "the first turn after the system messages must be the user's"
    previous = None
    for i, role in enumerate(turns):
        if role != "tool" and role == previous:
            return f"roles must alternate user/assistant: two {role} turns before turn {i}"
        previous = None if role == "tool" else role
    return None


def strict_alternation(reply: Reply) -> Reply:
    async def answer(request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        try:
            payload = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            payload = None
        problem = (
            alternation_problem(payload.get("messages")) if isinstance(payload, dict) else None
        )
        if problem is not None:
            error = {
                "message": f"Conversation roles must alternate: {problem}",
                "type": "BadRequestError",
            }
            return web.json_response({"error": error}, status=400)
        return await reply(request, upstream)

    return answer
