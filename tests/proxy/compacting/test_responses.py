"""The Responses API end to end: raw requests and the real `openai` SDK's client.responses,
against a fake upstream that checks what the real API would refuse."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from bench.dialects import to_responses
from compaction import SUMMARY_MARKER
from compaction.messages import RESPONSES
from tests import factories as f
from tests.fakes.apis import responses_events, responses_object
from tests.fakes.script import SUMMARY_TEXT, Script, body_tokens
from tests.fakes.upstream import json_reply, stream_reply
from tests.proxy.compacting.conftest import WINDOW, forwarded

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def responses_body(target_tokens: int, **fields: Any) -> dict[str, Any]:
    """A Responses request of about `target_tokens`: instructions, function tools, reasoning,
    function_call / function_call_output items, ending with the user's new request."""
    messages: list[dict[str, Any]] = [f.system()]
    body = to_responses(messages, TOOLS)
    i = 0
    while body_tokens("/v1/responses", body) < target_tokens:
        messages += f.tool_round(i, blocks=2, output_chars=300)
        i += 1
        body = to_responses([*messages, f.user(f"Now do task {i}.")], TOOLS)
    return {**body, **fields}


async def send(client: Any, url: str, body: dict[str, Any] | bytes, **headers: str) -> Any:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    sent = {"Content-Type": "application/json", "Authorization": "Bearer sk-client", **headers}
    async with client.post(url, data=data, headers=sent) as response:
        await response.read()
        return response


async def test_a_long_input_is_compacted_into_valid_items(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    body = responses_body(int(WINDOW * 1.3), store=False, include=["reasoning.encrypted_content"])
    response = await send(client, f"{proxy.url}/v1/responses", body, **{"X-Session-Id": "r1"})
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"

    sent = forwarded(script)[0]
    assert script.upstream.requests[-1].path == "/v1/responses"
    assert script.problems == []
    for field in ("instructions", "tools", "store", "include", "model"):
        assert sent[field] == body[field]
    items = sent["input"]
    assert RESPONSES.is_summary(items[0]) and SUMMARY_MARKER in items[0]["content"][0]["text"]
    original = body["input"]
    # After the summary: pinned requests (the task, the cut round's), then the recent items.
    tail = next(k for k in range(1, len(items)) if items[k:] == original[k - len(items) :])
    assert all(item in original and item["role"] == "user" for item in items[1:tail])
    assert any(item["type"] == "reasoning" for item in items[tail:])
    assert body_tokens("/v1/responses", sent) < 0.85 * WINDOW

    summary_call = script.calls("summary")[0]
    assert summary_call.path == "/v1/responses"
    assert summary_call.headers["Authorization"] == "Bearer sk-client"
    asked = summary_call.json()
    assert asked["store"] is False and "tools" not in asked and asked["instructions"]


@pytest.mark.parametrize(
    "fields",
    [{"previous_response_id": "resp_123"}, {"conversation": "conv_1"}],
    ids=["previous_response_id", "conversation"],
)
async def test_history_kept_upstream_passes_through_byte_identical(
    start: Any, script: Script, client: Any, fields: dict[str, Any]
) -> None:
    proxy = await start()
    raw = orjson.dumps(responses_body(int(WINDOW * 1.3), **fields)).replace(b",", b", ")
    response = await send(client, f"{proxy.url}/v1/responses", raw)
    assert response.headers["x-compaction-status"] == "none"
    assert script.calls(None)[0].body == raw
    assert script.calls("summary") == []


async def test_a_string_input_passes_through_byte_identical(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    raw = orjson.dumps({"model": "m", "input": "word " * (WINDOW * 2)})
    response = await send(client, f"{proxy.url}/s/agent/v1/responses", raw)
    assert response.headers["x-compaction-status"] == "none"
    assert script.calls(None)[0].body == raw


async def test_a_context_length_error_is_retried_once_compacted(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"trigger_ratio": 0.99, "target_ratio": 0.6})
    overflow = {
        "error": {
            "message": "Your input exceeds the context window of this model.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
    script.upstream.reply_once(json_reply(overflow, status=400))
    body = responses_body(int(WINDOW * 0.9))
    response = await send(client, f"{proxy.url}/v1/responses", body, **{"X-Session-Id": "r2"})
    assert response.status == 200
    first, retry = script.calls(None)
    assert first.json() == body
    assert RESPONSES.is_summary(retry.json()["input"][0])
    assert script.problems == []


# -- the real SDK ---------------------------------------------------------------------------


@pytest.fixture
async def sdk(start: Any) -> Any:
    proxy = await start()
    client = AsyncOpenAI(
        base_url=f"{proxy.url}/s/sdk-responses/v1", api_key="sk-sdk", max_retries=0
    )
    try:
        yield client
    finally:
        await client.close()


SDK_TOOLS: Any = [
    {"type": "function", "name": "bash", "parameters": {"type": "object"}, "strict": False}
]


async def test_a_files_tokens_are_counted_by_its_size(start: Any, client: Any) -> None:
    proxy = await start()
    data = "data:application/pdf;base64," + "QUJD" * 10000
    file = {"type": "input_file", "filename": "spec.pdf", "file_data": data}
    question = {"type": "input_text", "text": "What does it say?"}
    body = {"model": "m", "input": [{"role": "user", "content": [file, question]}]}
    response = await send(client, f"{proxy.url}/v1/responses", body, **{"X-Session-Id": "doc"})
    assert response.status == 200
    assert int(response.headers["x-compaction-tokens-before"]) >= 4000


def refusal(param: str) -> web.Response:
    message = f"Unsupported parameter: '{param}' is not supported with this model."
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return web.json_response({"error": error}, status=400)


async def reasoning_model(request: web.Request) -> web.StreamResponse:
    """A gpt-5-like summarizer: no temperature; its reasoning counts in max_output_tokens (much
    of it unless asked for low effort), and a budget spent on reasoning leaves no text."""
    asked = await request.json()
    if "temperature" in asked:
        return refusal("temperature")
    reasoning = 200 if asked.get("reasoning", {}).get("effort") == "low" else 2000
    if asked["max_output_tokens"] < reasoning + 300:
        done = responses_object(reasoning="enc")
        return web.json_response({**done, "status": "incomplete"})
    return web.json_response(responses_object(SUMMARY_TEXT, reasoning="enc"))


async def plain_model(request: web.Request) -> web.StreamResponse:
    """A gpt-4.1-like summarizer: refuses any reasoning setting."""
    if "reasoning" in await request.json():
        return refusal("reasoning.effort")
    return web.json_response(responses_object(SUMMARY_TEXT))


@pytest.mark.parametrize("model", [reasoning_model, plain_model])
async def test_summaries_come_back_from_reasoning_and_plain_models(
    start: Any, script: Script, client: Any, model: Any
) -> None:
    script.summary = model
    proxy = await start()
    for session in ("m1", "m2"):
        body = responses_body(int(WINDOW * 1.3))
        response = await send(
            client, f"{proxy.url}/v1/responses", body, **{"X-Session-Id": session}
        )
        assert response.headers["x-compaction-status"] == "applied"
        assert "The user wants the failing tests fixed." in str(forwarded(script)[-1])
    # What the model refused is learned once: later summaries are asked right away.
    refused = "temperature" if model is reasoning_model else "reasoning"
    assert [refused in r.json() for r in script.calls("summary")] == [True, False, False]


async def test_the_sdk_runs_a_tool_loop_on_a_compacted_conversation(
    sdk: AsyncOpenAI, script: Script
) -> None:
    async def call_a_tool(request: web.Request) -> web.StreamResponse:
        call = ("call_next", "bash", '{"c": "ls"}')
        return web.json_response(responses_object(calls=[call], reasoning="b3BhcXVl"))

    script.chat = call_a_tool
    body = responses_body(int(WINDOW * 1.3))
    first = await sdk.responses.create(
        model="gpt-test", instructions=body["instructions"], input=body["input"], tools=SDK_TOOLS
    )
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content == "b3BhcXVl"
    assert call.type == "function_call" and call.call_id == "call_next"

    script.chat = script.counted("Done.")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
    loop = [*body["input"], *(item.model_dump(exclude_none=True) for item in first.output), output]
    second = await sdk.responses.create(
        model="gpt-test", instructions=body["instructions"], input=loop, tools=SDK_TOOLS
    )
    assert second.output_text == "Done."
    before, after = forwarded(script)
    assert RESPONSES.is_summary(after["input"][0]) and after["tools"] == SDK_TOOLS
    assert after["input"][: len(before["input"])] == before["input"]  # the same summary, reused
    assert after["input"][-1] == output
    assert script.problems == []


async def test_the_sdk_streams_a_compacted_response(sdk: AsyncOpenAI, script: Script) -> None:
    chat = script.chat
    script.chat = lambda request: stream_reply(responses_events("Streamed answer."))(
        request, script.upstream
    )
    body = responses_body(int(WINDOW * 1.3))
    stream = await sdk.responses.create(
        model="gpt-test",
        instructions=body["instructions"],
        input=body["input"],
        tools=SDK_TOOLS,
        stream=True,
    )
    deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
    assert "".join(deltas) == "Streamed answer."
    sent = forwarded(script)[0]
    assert sent["stream"] is True and RESPONSES.is_summary(sent["input"][0])
    assert script.problems == []
    script.chat = chat


async def test_concurrent_requests_of_one_conversation_wait_for_one_summary(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    summarize = script.summary

    async def slowly(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.2)
        return await summarize(request)

    script.summary = slowly
    body = responses_body(int(WINDOW * 1.3))
    url = f"{proxy.url}/s/together/v1/responses"
    responses = await asyncio.gather(*(send(client, url, body) for _ in range(5)))
    assert {r.headers["x-compaction-status"] for r in responses} <= {"applied", "reused"}
    assert len(script.calls("summary")) == 1
    first = forwarded(script)[0]["input"]
    assert all(sent["input"] == first for sent in forwarded(script))  # one summary for all
    assert script.problems == []
