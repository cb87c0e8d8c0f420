"""The cached summary request through the real proxy, in all three dialects: the summary (and
memory items) asked once, after the conversation's own last-forwarded request repeated byte for
byte (model, system, tools, messages), so the provider's prompt cache covers the conversation;
standalone where the cache cannot help."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.cost import mark_last_turn
from bench.dialects import to_anthropic, to_responses
from compaction import is_summary_message
from tests.fakes.script import SUMMARY_TEXT, Script, body_tokens, tokens
from tests.proxy.compacting.conftest import (
    conversation_of,
    forwarded,
    small_window_proxies,
    wait_for,
)
from tests.proxy.conftest import StartProxy

WIDE = 40_000
"""A window with room after a request at the precompute ratio for the question and answer."""
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
ANSWER = (
    f"<summary>\n{SUMMARY_TEXT}\n</summary>\n"
    '<memory>\n[{"type": "decision", "content": "Ship on Friday after the review."}]\n</memory>'
)
# path, the list's field, the fields that make up the prompt besides it, headers
DIALECTS: dict[str, tuple[str, str, tuple[str, ...], dict[str, str]]] = {
    "chat": ("chat/completions", "messages", ("model", "tools"), {}),
    "responses": ("responses", "input", ("model", "tools", "instructions"), {}),
    "anthropic": (
        "messages",
        "messages",
        ("model", "tools", "system"),
        {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"},
    ),
}


def body_of(dialect: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    if dialect == "responses":
        return {**to_responses(messages, TOOLS), "model": "gpt-test", "prompt_cache_key": "k1"}
    if dialect == "anthropic":
        body = mark_last_turn(to_anthropic(messages, TOOLS))
        return {**body, "model": "claude-test", "max_tokens": 4096}
    return {"model": "gpt-test", "messages": messages, "tools": TOOLS, "stream": False}


def sized(dialect: str, ratio: float) -> dict[str, Any]:
    """A request of `dialect` at about `ratio` of the window, as the proxy counts it."""
    path = DIALECTS[dialect][0]
    target = int(WIDE * ratio)
    body = body_of(dialect, conversation_of(target))
    counted = body_tokens(f"/v1/{path}", body)  # the conversions add reasoning and thinking
    if counted > target * 1.03:
        body = body_of(dialect, conversation_of(target * target // counted))
    return body


async def send(client: Any, proxy: Any, dialect: str, body: dict[str, Any]) -> str:
    path, _, _, extra = DIALECTS[dialect]
    headers = {"Authorization": "Bearer sk-client", "X-Session-Id": "agent-1", **extra}
    async with client.post(f"{proxy.url}/v1/{path}", json=body, headers=headers) as response:
        await response.read()
        assert response.status == 200
        return response.headers["x-compaction-status"]


async def start_wide(start: Any, upstream: Any, **compaction: Any) -> Any:
    return await start(
        models={"default_context_window": WIDE},
        upstream={"anthropic_base_url": upstream.base_url},
        compaction={"precompute_ratio": 0.7, "keep_recent_rounds": 2, **compaction},
    )


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_a_cached_summary_request_repeats_the_last_forwarded_request_byte_for_byte(
    dialect: str, start: Any, upstream: Any, script: Script, client: Any
) -> None:
    script.summary = script.answer(ANSWER)
    proxy = await start_wide(start, upstream)
    _, listed, prompt_fields, _ = DIALECTS[dialect]
    # Past the precompute ratio: forwarded as sent, then prepared ahead in the background.
    assert await send(client, proxy, dialect, sized(dialect, 0.78)) == "none"
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)
    [call] = script.calls("summary")
    last = forwarded(script)[-1]
    asked = call.json()
    for name in prompt_fields:
        assert asked[name] == last[name], name
    # The forwarded list is the summary request's list but its last item, byte for byte.
    assert orjson.dumps(last[listed])[:-1] + b"," in call.body
    assert asked[listed][:-1] == last[listed]
    question = asked[listed][-1]
    assert question["role"] == "user" and "<memory>" in orjson.dumps(question).decode()
    assert asked.get("stream") in (None, False)
    assert script.calls("memory") == []  # the memory items rode on the same call
    if dialect == "responses":
        assert asked["prompt_cache_key"] == "k1"
    if dialect == "anthropic":  # the client's breakpoints where it placed them, none added
        assert orjson.dumps(asked).count(b"cache_control") == orjson.dumps(last).count(
            b"cache_control"
        )


async def test_the_cached_answer_becomes_the_summary_that_goes_out(
    start: Any, upstream: Any, script: Script, client: Any
) -> None:
    script.summary = script.answer(ANSWER)
    proxy = await start_wide(start, upstream)
    messages = conversation_of(int(WIDE * 0.78))
    assert await send(client, proxy, "chat", body_of("chat", messages)) == "none"
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)
    grown = conversation_of(int(WIDE * 0.9), grow=messages)
    status = await send(client, proxy, "chat", body_of("chat", grown))
    assert status == "applied"
    summary = forwarded(script)[-1]["messages"][1]
    assert is_summary_message(summary)
    assert "The user wants the failing tests fixed." in summary["content"]
    assert "<memory>" not in summary["content"]


@pytest.mark.parametrize(
    "compaction",
    [{"summary_request": "standalone"}, {"summary_model": "gpt-small"}],
    ids=["standalone", "another-model"],
)
async def test_a_summary_asked_standalone_carries_the_transcript_and_no_tools(
    compaction: dict[str, Any], start: Any, upstream: Any, script: Script, client: Any
) -> None:
    proxy = await start_wide(start, upstream, **compaction)
    assert await send(client, proxy, "chat", sized("chat", 0.78)) == "none"
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)
    asked = script.calls("summary")[0].json()
    assert "tools" not in asked and asked["messages"][0]["role"] == "system"
    assert "<transcript>" in asked["messages"][-1]["content"]
    assert len(script.calls("memory")) == 1


async def test_a_forced_tool_choice_is_lifted_so_the_summarizer_answers_in_text(
    start: Any, upstream: Any, script: Script, client: Any
) -> None:
    proxy = await start_wide(start, upstream)
    body = {**sized("chat", 0.78), "tool_choice": "required", "stream": True}
    body["stream_options"] = {"include_usage": True}
    await send(client, proxy, "chat", body)
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)
    asked = script.calls("summary")[0].json()
    assert asked["tool_choice"] == "none" and asked["stream"] is False
    assert "stream_options" not in asked and asked["tools"] == TOOLS


RECALL_TOOL = b'"name":"recall"'


async def grow_until_asked(
    client: Any, proxy: Any, script: Script, dialect: str, summaries: int
) -> None:
    """Send the conversation growing by a tenth of the window a request, until the proxy has
    asked `summaries` summaries (at most 12 requests)."""
    messages = conversation_of(int(WIDE * 0.3))
    for _ in range(12):
        # The conversions add reasoning and thinking: a tenth of the window as the dialect counts.
        chat = tokens(messages)
        step = WIDE // 10 * chat // body_tokens_of(dialect, messages)
        messages = conversation_of(chat + step, grow=messages)
        await send(client, proxy, dialect, body_of(dialect, messages))
        await asyncio.sleep(0.05)  # a compaction prepared ahead asks in the background
        if len(script.calls("summary")) >= summaries:
            return
    raise AssertionError(f"{len(script.calls('summary'))} summaries asked, not {summaries}")


def body_tokens_of(dialect: str, messages: list[dict[str, Any]]) -> int:
    return body_tokens(f"/v1/{DIALECTS[dialect][0]}", body_of(dialect, messages))


@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_a_compacted_view_is_repeated_with_the_recall_tool_it_went_upstream_with(
    dialect: str,
    start_proxy: StartProxy,
    tmp_path: Path,
    upstream: Any,
    script: Script,
    client: Any,
) -> None:
    """The second compaction summarizes a view that went upstream compacted, so with the recall
    tool after the client's tools and the recall line in its summary: the summary request
    carries both, or its prompt parts from the forwarded one at the tools and the provider's
    cache covers nothing of it."""
    script.summary = script.answer(ANSWER)
    start = small_window_proxies(start_proxy, tmp_path, recall="on")
    proxy = await start_wide(start, upstream)
    await grow_until_asked(client, proxy, script, dialect, 2)
    await wait_for(lambda: len(script.calls("summary")) >= 2, 10)
    call = script.calls("summary")[1]
    _, listed, prompt_fields, _ = DIALECTS[dialect]
    asked = call.json()
    repeated = [r for r in forwarded(script) if r[listed] == asked[listed][:-1]]
    assert repeated, "no forwarded request is the summary request's prefix"
    last = repeated[-1]
    assert RECALL_TOOL in orjson.dumps(last["tools"])  # it went upstream equipped
    for name in prompt_fields:
        assert asked[name] == last[name], name
    assert orjson.dumps(last[listed])[:-1] + b"," in call.body
