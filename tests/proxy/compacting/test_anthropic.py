"""Anthropic Messages end to end: raw requests and the real `anthropic` SDK, against a fake
upstream that refuses what Anthropic would (turn order, unpaired tool blocks, altered thinking)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from anthropic import AsyncAnthropic
from yarl import URL

from bench.dialects import signature_of, to_anthropic
from compaction import SUMMARY_MARKER
from compaction.messages import ANTHROPIC
from tests import factories as f
from tests.fakes.apis import anthropic_events, anthropic_message
from tests.fakes.script import Script, body_tokens
from tests.fakes.upstream import FakeUpstream, json_reply, stream_reply
from tests.proxy.compacting.conftest import WINDOW, forwarded

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
HEADERS = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}


def anthropic_body(
    target_tokens: int, *, single_task: bool = False, **fields: Any
) -> dict[str, Any]:
    """A Messages request of about `target_tokens`: system with cache_control, tools, thinking
    blocks with signatures, tool_use / tool_result turns, ending with a user turn."""
    messages: list[dict[str, Any]] = [f.system(), f.user("Start the work.")]
    body = to_anthropic(messages, TOOLS)
    i = 0
    while body_tokens("/v1/messages", body) < target_tokens:
        if single_task:
            messages += f.tool_block(1, output="output line " * 25)
        else:
            messages += f.tool_round(i, blocks=2, output_chars=300)
        i += 1
        body = to_anthropic([*messages, f.user(f"Now do task {i}.")], TOOLS)
    return {**body, **fields}


@pytest.fixture
async def proxy(start: Any, upstream: FakeUpstream) -> Any:
    return await start(upstream={"anthropic_base_url": upstream.base_url})


async def send(client: Any, url: str | URL, body: dict[str, Any] | bytes, **headers: str) -> Any:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with client.post(
        url, data=data, headers={"Content-Type": "application/json", **HEADERS, **headers}
    ) as response:
        return response, await response.read()


async def test_a_long_conversation_is_compacted_into_alternating_turns(
    proxy: Any, script: Script, client: Any
) -> None:
    body = anthropic_body(int(WINDOW * 1.3), thinking={"type": "enabled", "budget_tokens": 1024})
    response, _ = await send(client, f"{proxy.url}/v1/messages", body, **{"X-Session-Id": "a1"})
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    assert script.problems == []

    sent = forwarded(script)[0]
    for field in ("system", "tools", "thinking", "max_tokens", "model"):
        assert sent[field] == body[field]  # system's cache_control included
    turns = sent["messages"]
    first = turns[0]["content"]
    # The summary and the user turns after it (pinned requests, a kept turn) are one turn.
    assert first[0]["type"] == "text" and first[0]["text"].startswith(SUMMARY_MARKER)
    said = [b for m in body["messages"] if m["role"] == "user" for b in m["content"]]
    assert len(first) > 1 and all(block in said for block in first[1:])
    assert turns[1:] == body["messages"][-len(turns) + 1 :]  # thinking and signatures intact
    assert any(
        b["type"] == "thinking" for t in turns for b in t["content"] if t["role"] == "assistant"
    )
    assert body_tokens("/v1/messages", {**sent, "messages": turns}) < 0.85 * WINDOW

    summary_call = script.calls("summary")[0]
    assert summary_call.path == "/v1/messages"
    assert summary_call.headers["x-api-key"] == "sk-ant-client"
    assert summary_call.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in summary_call.headers
    asked = summary_call.json()
    assert asked["system"] and asked["messages"][0]["role"] == "user" and "tools" not in asked

    admin = {"Authorization": "Bearer admin-secret"}
    async with client.get(f"{proxy.url}/admin/sessions/a1", headers=admin) as response:
        assert (await response.json())["records"][0]["dialect"] == "anthropic"
    async with client.get(f"{proxy.url}/metrics") as response:
        text = (await response.read()).decode()
    assert 'compaction_proxy_chat_decisions_total{dialect="anthropic",status="applied"} 1.0' in text
    assert 'compaction_proxy_requests_total{method="POST",route="messages",status="200"}' in text


async def test_a_cut_inside_one_long_task_keeps_the_turns_alternating(
    proxy: Any, script: Script, client: Any
) -> None:
    body = anthropic_body(int(WINDOW * 1.3), single_task=True)
    response, _ = await send(client, f"{proxy.url}/v1/messages", body, **{"X-Session-Id": "a2"})
    assert response.headers["x-compaction-status"] == "applied"
    assert script.problems == []
    turns = forwarded(script)[0]["messages"]
    assert [t["role"] for t in turns[:2]] == ["user", "assistant"]


@pytest.mark.parametrize(
    "message",
    [
        "prompt is too long: 4100 tokens > 4000 maximum",
        # Anthropic's wording when the prompt fits but prompt + max_tokens does not.
        "input length and `max_tokens` exceed context limit: 3990 + 64 > 4000, decrease input"
        " length or `max_tokens` and try again",
    ],
)
async def test_prompt_is_too_long_is_retried_once_compacted(
    start: Any, upstream: FakeUpstream, script: Script, client: Any, message: str
) -> None:
    proxy = await start(
        upstream={"anthropic_base_url": upstream.base_url}, compaction={"trigger_ratio": 0.99}
    )
    refusal = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    upstream.reply_once(json_reply(refusal, status=400))
    body = anthropic_body(int(WINDOW * 0.9), max_tokens=64)
    response, _ = await send(client, f"{proxy.url}/v1/messages", body, **{"X-Session-Id": "a3"})
    assert response.status == 200
    first, retry = script.calls(None)
    assert first.json() == body
    assert SUMMARY_MARKER in retry.body.decode()
    assert script.problems == []


async def test_messages_go_to_the_anthropic_upstream_and_the_rest_to_base_url(
    start: Any, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async with FakeUpstream() as anthropic:
        proxy = await start(
            upstream={"anthropic_base_url": anthropic.base_url, "api_key": "sk-openai-only"}
        )
        raw = b'{"model": "claude", "messages": [{"role": "user", "content": "hi"}]}'
        for path in ("/v1/messages/count_tokens?beta=true", "/s/sess/v1/messages"):
            response, _ = await send(client, f"{proxy.url}{path}", raw)
            assert response.status == 200
        assert [r.raw_path for r in anthropic.requests] == [
            "/v1/messages/count_tokens",
            "/v1/messages",
        ]
        assert anthropic.requests[0].query_string == "beta=true"
        assert all(r.body == raw for r in anthropic.requests)
        # The OpenAI key is never handed to Anthropic.
        assert all("Authorization" not in r.headers for r in anthropic.requests)
        async with client.get(f"{proxy.url}/v1/models") as response:
            assert response.status == 200
        assert [r.path for r in upstream.requests] == ["/v1/models"]
        assert upstream.requests[0].headers["Authorization"] == "Bearer sk-openai-only"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/%6Dessages", "/s/enc/v1/%6dessages"])
async def test_the_openai_key_never_reaches_anthropic_on_agent_or_summary_calls(
    start: Any, upstream: FakeUpstream, client: aiohttp.ClientSession, path: str
) -> None:
    # aiohttp routes the decoded path: a percent-encoded `messages` is the messages route, so
    # it must also go to Anthropic, and its summary calls must not borrow the OpenAI key.
    async with FakeUpstream() as anthropic:
        Script(anthropic)
        proxy = await start(
            upstream={"anthropic_base_url": anthropic.base_url, "api_key": "sk-openai-only"}
        )
        body = anthropic_body(int(WINDOW * 1.3))
        url = URL(f"{proxy.url}{path}", encoded=True)
        response, _ = await send(client, url, body, **{"X-Session-Id": "key"})
        assert response.status == 200
        assert response.headers["x-compaction-status"] == "applied"
        assert upstream.requests == []
        purposes = [r.headers.get("X-Compaction-Purpose") for r in anthropic.requests]
        assert "summary" in purposes and None in purposes
        for seen in anthropic.requests:
            assert "sk-openai-only" not in str(list(seen.headers.items()))
            assert seen.headers["x-api-key"] == "sk-ant-client"


async def test_an_anthropic_client_outside_messages_is_not_given_the_openai_key(
    start: Any, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    # Anthropic's other endpoints (/v1/models, /v1/files) go to base_url like any path, but a
    # request that speaks Anthropic (x-api-key, anthropic-version) is not an OpenAI client's.
    upstream.reply(json_reply({"data": [], "has_more": False, "first_id": None, "last_id": None}))
    proxy = await start(upstream={"api_key": "sk-openai-only"})
    sdk = AsyncAnthropic(base_url=proxy.url, api_key="sk-ant-sdk", max_retries=0)
    async with sdk:
        await sdk.models.list()
    for headers in ({"x-api-key": "sk-ant-raw"}, {"anthropic-version": "2023-06-01"}):
        async with client.get(f"{proxy.url}/v1/models", headers=headers) as response:
            assert response.status == 200
    assert [r.path for r in upstream.requests] == ["/v1/models"] * 3
    sdk_call, keyed, versioned = upstream.requests
    assert sdk_call.headers.getall("Authorization") == ["Bearer sk-ant-sdk"]  # its own, kept
    assert keyed.headers["x-api-key"] == "sk-ant-raw"
    assert "Authorization" not in keyed.headers and "Authorization" not in versioned.headers


@pytest.mark.parametrize(
    ("source", "at_least"),
    [
        ({"type": "text", "media_type": "text/plain", "data": "word " * 8000}, 6000),
        ({"type": "content", "content": [{"type": "text", "text": "word " * 8000}]}, 6000),
        ({"type": "base64", "media_type": "application/pdf", "data": "QUJD" * 10000}, 4000),
    ],
)
async def test_a_documents_tokens_are_counted_by_its_size(
    proxy: Any, client: Any, source: dict[str, Any], at_least: int
) -> None:
    body = {
        "model": "claude",
        "max_tokens": 64,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "document", "source": source}, {"type": "text", "text": "?"}],
            }
        ],
    }
    response, _ = await send(client, f"{proxy.url}/v1/messages", body, **{"X-Session-Id": "doc"})
    assert response.status == 200
    assert int(response.headers["x-compaction-tokens-before"]) >= at_least


async def test_thinking_of_a_finished_turn_is_not_counted(proxy: Any, client: Any) -> None:
    # Anthropic strips thinking from turns before the last user turn; an answer without
    # tool_use ended its turn, so its thinking is never counted again.
    thought = "step " * 4000
    turn = [
        {"type": "thinking", "thinking": thought, "signature": signature_of(thought)},
        {"type": "text", "text": "Done."},
    ]
    body = {
        "model": "claude",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "Fix it."},
            {"role": "assistant", "content": turn},
            {"role": "user", "content": "Thanks, now the docs."},
        ],
    }
    response, _ = await send(client, f"{proxy.url}/v1/messages", body, **{"X-Session-Id": "th"})
    assert response.status == 200
    assert int(response.headers["x-compaction-tokens-before"]) < 200


async def test_the_proxys_own_errors_take_anthropics_shape(start: Any, client: Any) -> None:
    proxy = await start(upstream={"anthropic_base_url": "http://127.0.0.1:9/v1"})
    response, raw = await send(client, f"{proxy.url}/s/.bad/v1/messages", b"{}")
    assert response.status == 400
    assert orjson.loads(raw)["type"] == "error"
    assert orjson.loads(raw)["error"]["type"] == "invalid_request_error"
    response, raw = await send(client, f"{proxy.url}/v1/messages", b"{}")
    assert response.status == 502
    assert orjson.loads(raw) == {
        "type": "error",
        "error": {"type": "api_error", "message": "cannot connect to the upstream"},
    }


# -- the real SDK ---------------------------------------------------------------------------


@pytest.fixture
async def sdk(proxy: Any) -> AsyncIterator[AsyncAnthropic]:
    client = AsyncAnthropic(
        base_url=f"{proxy.url}/s/sdk-anthropic", api_key="sk-ant-sdk", max_retries=0
    )
    try:
        yield client
    finally:
        await client.close()


SDK_TOOLS: Any = [{"name": "bash", "input_schema": {"type": "object"}}]
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}


async def test_the_sdk_runs_a_tool_loop_with_thinking_on_a_compacted_conversation(
    sdk: AsyncAnthropic, script: Script
) -> None:
    thought = "The user wants the files listed."

    async def think_and_call(request: web.Request) -> web.StreamResponse:
        use = ("toolu_next", "bash", {"command": "ls"})
        message = anthropic_message(tool_uses=[use], thinking=(thought, signature_of(thought)))
        return web.json_response(message)

    script.chat = think_and_call
    body = anthropic_body(int(WINDOW * 1.3))
    ask = {"model": "claude-test", "max_tokens": 2048, "system": body["system"]}
    first = await sdk.messages.create(
        **ask, messages=body["messages"], tools=SDK_TOOLS, thinking=THINKING
    )
    assert [block.type for block in first.content] == ["thinking", "tool_use"]

    script.chat = script.counted("Done.")
    result = {"type": "tool_result", "tool_use_id": "toolu_next", "content": "a.txt"}
    loop = [
        *body["messages"],
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [result]},
    ]
    second = await sdk.messages.create(**ask, messages=loop, tools=SDK_TOOLS, thinking=THINKING)
    assert second.content[0].type == "text" and second.content[0].text == "Done."
    before, after = forwarded(script)
    assert after["thinking"] == THINKING and after["tools"] == SDK_TOOLS
    assert ANTHROPIC.read(after["messages"][0]).text.startswith(SUMMARY_MARKER)
    assert after["messages"][: len(before["messages"])] == before["messages"]  # reused
    assert after["messages"][-2]["content"][0]["signature"] == signature_of(thought)
    summary_call, agent_call = script.calls("summary")[0], script.calls(None)[0]
    for name in ("x-api-key", "Authorization", "anthropic-version"):  # as the SDK sent them
        assert summary_call.headers.get(name) == agent_call.headers.get(name)
    assert script.problems == []


async def test_the_sdk_streams_a_compacted_answer(sdk: AsyncAnthropic, script: Script) -> None:
    script.chat = lambda request: stream_reply(anthropic_events("Streamed answer."))(
        request, script.upstream
    )
    body = anthropic_body(int(WINDOW * 1.3))
    stream = await sdk.messages.create(
        model="claude-test",
        max_tokens=2048,
        system=body["system"],
        messages=body["messages"],
        tools=SDK_TOOLS,
        thinking=THINKING,
        stream=True,
    )
    texts = [
        event.delta.text
        async for event in stream
        if event.type == "content_block_delta" and event.delta.type == "text_delta"
    ]
    assert "".join(texts) == "Streamed answer."
    sent = forwarded(script)[0]
    assert sent["stream"] is True and SUMMARY_MARKER in orjson.dumps(sent["messages"][0]).decode()
    assert script.problems == []
