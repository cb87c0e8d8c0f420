"""The chat hook seam: what the compaction layer gets to see and change."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.compacting.decision.request import fingerprint as fingerprint_of
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.interception import Exchange, RequestContext
from proxy.outcome import Outcome
from tests.fakes.upstream import (
    FakeUpstream,
    chat_chunk,
    chat_completion,
    json_reply,
    raw_reply,
    sse_events,
    stream_reply,
)
from tests.proxy.conftest import StartProxy

OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


def fingerprint(payload: dict[str, Any]) -> str:
    """The session a chat request that names none gets."""
    messages = payload.get("messages")
    listed = messages if isinstance(messages, list) else []
    return fingerprint_of(CHAT_COMPLETIONS.opening(payload, listed))


class RecordingHook:
    """Rewrites the body, names the session, and asks for one retry on an upstream 400; records
    what its exchanges were shown."""

    def __init__(
        self, retry_with: bytes | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self.headers = headers or {}
        self.contexts: list[RequestContext] = []
        self.errors: list[tuple[int, bytes]] = []
        self.responses: list[tuple[int, dict[str, Any] | None]] = []
        self.retry_with = retry_with

    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        self.contexts.append(ctx)
        payload = orjson.loads(body)
        session = ctx.explicit_session or fingerprint(payload)
        payload["messages"] = payload["messages"][-1:]
        return RecordingExchange(self, orjson.dumps(payload), session, self.headers)


@dataclass
class RecordingExchange:
    hook: RecordingHook
    body: bytes
    session_id: str
    upstream_headers: dict[str, str]
    outcome: Outcome = field(default_factory=lambda: Outcome("applied"))
    wants_usage: bool = True
    followup: None = None

    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        self.hook.errors.append((status, body))
        return self.hook.retry_with

    def observe(self, status: int, usage: dict[str, Any] | None) -> None:
        self.hook.responses.append((status, usage))


LONG = orjson.dumps(
    {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "old"},
            {"role": "user", "content": "new"},
        ],
    }
)


async def test_the_hook_body_is_sent_and_its_headers_reach_the_client(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook()
    proxy = await start_proxy(hook=hook, upstream={"api_key": "sk-injected"})
    async with client.post(
        f"{proxy.url}/s/agent-1/v1/chat/completions?q=1",
        data=LONG,
        headers={"X-Trace": "t"},
    ) as response:
        assert response.headers["x-compaction-status"] == "applied"
        assert orjson.loads(await response.read()) == chat_completion("hello")
    sent = upstream.requests[-1]
    assert sent.json()["messages"] == [{"role": "user", "content": "new"}]
    assert sent.headers["Content-Length"] == str(len(sent.body))
    ctx = hook.contexts[-1]
    assert ctx.route == "chat"
    assert ctx.explicit_session == "agent-1"
    assert ctx.credential == "Bearer sk-injected"
    assert ctx.path == "/s/agent-1/v1/chat/completions"
    assert ctx.headers["X-Trace"] == "t"
    assert hook.responses == [
        (200, {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
    ]


async def test_the_exchanges_upstream_headers_join_the_clients_on_the_request_and_its_retry(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    # What the hook's body needs besides the client's headers (a beta for a compaction block
    # of the proxy's): set on what goes upstream, the retry included; the client's others stay.
    hook = RecordingHook(retry_with=b'{"model":"m","messages":[]}', headers={"x-beta": "b2"})
    proxy = await start_proxy(hook=hook)
    upstream.reply_once(json_reply(OVERFLOW, status=400))
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=LONG, headers={"X-Trace": "t", "x-beta": "b1"}
    ) as response:
        assert response.status == 200
    for sent in upstream.requests:
        assert sent.headers["x-beta"] == "b2" and sent.headers["X-Trace"] == "t"
    assert len(upstream.requests) == 2


async def test_header_session_wins_over_the_path(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook()
    proxy = await start_proxy(hook=hook)
    async with client.post(
        f"{proxy.url}/s/from-path/v1/chat/completions",
        data=LONG,
        headers={"X-Session-Id": "from-header"},
    ):
        pass
    assert hook.contexts[-1].explicit_session == "from-header"


async def test_an_upstream_400_is_shown_to_the_exchange_and_retried_once(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook(retry_with=b'{"model":"m","messages":[]}')
    proxy = await start_proxy(hook=hook)
    upstream.reply_once(json_reply(OVERFLOW, status=400), json_reply(OVERFLOW, status=400))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG) as response:
        # The retry failed too: its error is relayed, and there is no second retry.
        assert response.status == 400
        assert orjson.loads(await response.read()) == OVERFLOW
    assert [r.body for r in upstream.requests][1] == b'{"model":"m","messages":[]}'
    assert len(upstream.requests) == 2
    assert hook.errors == [(400, orjson.dumps(OVERFLOW))]


async def test_a_successful_retry_is_what_the_client_receives(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook(retry_with=b'{"model":"m","messages":[]}')
    proxy = await start_proxy(hook=hook)
    upstream.reply_once(json_reply(OVERFLOW, status=400))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG) as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == chat_completion("hello")
    assert hook.responses[-1][0] == 200


async def test_without_a_retry_the_error_is_relayed_unchanged_even_compressed(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook(retry_with=None)
    proxy = await start_proxy(hook=hook)
    raw = gzip.compress(orjson.dumps(OVERFLOW))
    upstream.reply(raw_reply(raw, status=422, headers={"Content-Encoding": "gzip", "x-id": "7"}))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG) as response:
        assert response.status == 422
        assert response.headers["x-id"] == "7"
        assert await response.read() == raw
    # The hook saw the decoded error; the client got the upstream's bytes.
    assert hook.errors == [(422, orjson.dumps(OVERFLOW))]
    assert len(upstream.requests) == 1


async def test_other_upstream_errors_are_not_shown_to_the_exchange(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook(retry_with=b"{}")
    proxy = await start_proxy(hook=hook)
    upstream.reply(json_reply(OVERFLOW, status=429))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG) as response:
        assert response.status == 429
    assert hook.errors == []
    assert len(upstream.requests) == 1


async def test_usage_is_found_at_the_end_of_a_stream(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook()
    proxy = await start_proxy(hook=hook)
    usage = {"prompt_tokens": 1234, "completion_tokens": 5, "total_tokens": 1239}
    upstream.reply(
        stream_reply(
            sse_events(
                chat_chunk("a"), chat_chunk(None, finish=True), chat_chunk(None, usage=usage)
            )
        )
    )
    async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG) as response:
        await response.read()
    assert hook.responses == [(200, usage)]


async def test_usage_is_none_when_absent(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    hook = RecordingHook()
    proxy = await start_proxy(hook=hook)
    upstream.reply(stream_reply(sse_events(chat_chunk("a"), chat_chunk(None, finish=True))))
    async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG) as response:
        await response.read()
    assert hook.responses == [(200, None)]


async def test_the_resolved_session_is_touched_in_the_records(
    start_proxy: StartProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(hook=RecordingHook(), admin={"token": "t0k"})
    for _ in range(2):
        async with client.post(f"{proxy.url}/v1/chat/completions", data=LONG):
            pass
    expected = fingerprint(orjson.loads(LONG))
    async with client.get(
        f"{proxy.url}/admin/sessions/{expected}", headers={"Authorization": "Bearer t0k"}
    ) as response:
        assert response.status == 200
        assert (await response.json())["requests"] == 2
