"""An upstream context-length error: one compacted retry, and calibration from upstream usage."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web

from compaction import is_summary_message
from tests import factories as f
from tests.fakes.script import Script, tokens
from tests.fakes.upstream import chat_completion
from tests.proxy.compacting.conftest import (
    WINDOW,
    conversation_of,
    forwarded,
    post,
)


async def test_a_context_length_error_is_retried_once_compacted(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    overflow = {
        "error": {
            "message": "This model's maximum context length is 2000 tokens. However, your "
            "messages resulted in 3100 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    chat = script.chat
    seen = 0

    async def overflow_once(request: web.Request) -> web.StreamResponse:
        nonlocal seen
        seen += 1
        if seen == 1:
            return web.json_response(overflow, status=400)
        return await chat(request)

    script.chat = overflow_once
    messages = conversation_of(int(WINDOW * 0.7))
    response = await post(client, proxy, messages)
    assert response.status == 200
    first, second = forwarded(script)
    assert first["messages"] == messages
    assert is_summary_message(second["messages"][1])
    assert tokens(second["messages"]) < 2000


async def test_a_second_context_length_error_is_relayed_not_retried_again(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    overflow = orjson.dumps({"error": {"message": "too long", "code": "context_length_exceeded"}})

    async def always(request: web.Request) -> web.StreamResponse:
        return web.Response(status=400, body=overflow, content_type="application/json")

    script.chat = always
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "m", "messages": conversation_of(int(WINDOW * 0.7))},
    ) as response:
        assert response.status == 400
        assert await response.read() == overflow
    assert len(script.calls(None)) == 2


async def test_an_overflow_that_cannot_be_compacted_further_is_relayed_without_a_retry(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    overflow = orjson.dumps(
        {"error": {"message": "prompt is too long", "code": "context_length_exceeded"}}
    )

    async def always(request: web.Request) -> web.StreamResponse:
        return web.Response(status=400, body=overflow, content_type="application/json")

    script.chat = always
    messages = [f.system(), f.user("x " * 5000)]  # one round: nothing can be folded
    async with client.post(
        f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": messages}
    ) as response:
        assert response.status == 400 and await response.read() == overflow
    assert len(script.calls(None)) == 1


async def test_calibration_after_an_overflow_retry_reads_the_retried_request(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    seen = 0

    async def heavy_tokenizer(request: web.Request) -> web.StreamResponse:
        nonlocal seen
        seen += 1
        payload = await request.json()
        prompt = int(tokens(payload["messages"]) * 1.5)
        if seen == 1:
            return web.json_response(
                {
                    "error": {
                        "message": f"prompt is too long: {prompt} tokens > 4000 maximum",
                        "code": "context_length_exceeded",
                    }
                },
                status=400,
            )
        return web.json_response(
            chat_completion(
                "ok", {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
            )
        )

    script.chat = heavy_tokenizer
    messages = conversation_of(int(WINDOW * 0.75))
    response = await post(client, proxy, messages)
    assert response.status == 200 and len(script.calls(None)) == 2
    # Calibrated on the retried request: the next estimate of the same history is 1.5 times ours.
    again = await post(client, proxy, messages)
    before = int(again.headers["x-compaction-tokens-before"])
    assert before == pytest.approx(tokens(messages) * 1.5, rel=0.05)


async def test_upstream_usage_calibrates_the_estimate(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 0.5))
    raw = tokens(messages)
    script.chat = Script.answer(
        "ok", usage={"prompt_tokens": raw * 2, "completion_tokens": 1, "total_tokens": raw * 2}
    )
    first = await post(client, proxy, messages)
    assert first.headers["x-compaction-status"] == "none"
    # The upstream counts twice what we estimate: the same size now crosses the trigger.
    grown = [*messages, f.assistant("ok"), f.user("and now?")]
    second = await post(client, proxy, grown)
    assert second.headers["x-compaction-status"] == "applied"
