"""Compaction at the trigger, end to end: what the upstream receives near the window."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from bench.corpus import read_corpus
from compaction import SUMMARY_MARKER, is_summary_message
from compaction.invariants import check_tool_pairing
from tests import factories as f
from tests.fakes.script import Script, tokens
from tests.fakes.upstream import chat_completion
from tests.proxy.compacting.conftest import (
    WINDOW,
    conversation_of,
    forwarded,
    post,
)


async def test_below_the_trigger_the_bytes_go_upstream_untouched(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 0.75))
    body = orjson.dumps(
        {"model": "gpt-test", "messages": messages, "vendor_knob": {"x": [1, 2.50]}}
    )
    body = body.replace(b'"model"', b' "model" ')  # odd spacing survives too
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 200
        assert response.headers["x-compaction-status"] == "none"
    assert script.calls(None)[0].body == body
    assert script.calls("summary") == []


async def test_over_the_trigger_head_tools_and_recent_rounds_are_kept(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    proxy = await start(compaction={"summary_request": "standalone"})
    messages = conversation_of(int(WINDOW * 1.3))
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    response = await post(client, proxy, messages, tools=tools, tool_choice="auto", vendor_knob=[1])
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    assert int(response.headers["x-compaction-tokens-after"]) < int(
        response.headers["x-compaction-tokens-before"]
    )

    sent = forwarded(script)[0]
    assert sent["tools"] == tools and sent["tool_choice"] == "auto" and sent["vendor_knob"] == [1]
    out = sent["messages"]
    assert out[0] == messages[0]
    assert is_summary_message(out[1]) and out[1]["content"].startswith(SUMMARY_MARKER)
    assert "standard library" in out[1]["content"]
    user_starts = [i for i, m in enumerate(messages) if m["role"] == "user"]
    # Pinned after the summary: the task (first request), and the request of a round cut inside.
    kept_from = next(
        i for i in range(len(messages)) if messages[i:] == out[len(out) - len(messages) + i :]
    )
    pinned = out[2 : len(out) - (len(messages) - kept_from)]
    assert pinned[0] == messages[1] and all(m["role"] == "user" for m in pinned)
    assert kept_from <= user_starts[-2]  # keep_recent_rounds = 2 is a minimum
    assert check_tool_pairing(out) == []
    assert tokens(out, tools) < 0.85 * WINDOW

    summary_call = script.calls("summary")[0]
    assert summary_call.headers["Authorization"] == "Bearer sk-client"
    assert summary_call.json()["model"] == "gpt-test" and "tools" not in summary_call.json()
    assert len(script.calls("memory")) == 1

    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    lines = [orjson.loads(line) for line in memory_file.read_bytes().splitlines()]
    assert lines and all(
        set(line) == {"type", "content", "session_id", "compaction_id", "timestamp"}
        for line in lines
    )
    assert {"decision"} <= {line["type"] for line in lines}
    assert all(line["session_id"] == "agent-1" for line in lines)
    assert stat.S_IMODE(os.stat(memory_file).st_mode) == 0o600


async def test_two_sessions_never_share_summaries_or_memory(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    proxy = await start()

    async def echo_summary(request: web.Request) -> web.StreamResponse:
        transcript = orjson.dumps(await request.json()).decode()
        secret = "AZURE-42" if "AZURE-42" in transcript else "CRIMSON-7"
        return web.json_response(chat_completion(f"## Facts\n- The code word is {secret}."))

    async def echo_memory(request: web.Request) -> web.StreamResponse:
        transcript = orjson.dumps(await request.json()).decode()
        secret = "AZURE-42" if "AZURE-42" in transcript else "CRIMSON-7"
        return web.json_response(
            chat_completion(orjson.dumps([{"type": "fact", "content": secret}]).decode())
        )

    script.summary, script.memory = echo_summary, echo_memory
    for session, secret in (("alice", "AZURE-42"), ("bob", "CRIMSON-7")):
        messages = conversation_of(int(WINDOW * 1.2))
        # messages[1] is the task, pinned: the secret goes in a request that is folded.
        messages[4] = f.user(f"The code word is {secret}. Please fix the failing test.")
        await post(client, proxy, messages, session=session)
    alice, bob = (sent["messages"][1]["content"] for sent in forwarded(script))
    assert "AZURE-42" in alice and "CRIMSON-7" not in alice
    assert "CRIMSON-7" in bob and "AZURE-42" not in bob
    memory = tmp_path / "memory"
    assert "CRIMSON-7" not in (memory / "alice" / "compaction_flush.jsonl").read_text()
    assert "AZURE-42" not in (memory / "bob" / "compaction_flush.jsonl").read_text()
    # The same conversation under another credential is summarized afresh, never reused.
    await post(client, proxy, messages, session="bob", auth="Bearer sk-other-tenant")
    assert len(script.calls("summary")) == 3


async def test_admin_records_and_metrics_describe_compactions(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    admin = {"Authorization": "Bearer admin-secret"}
    async with client.get(f"{proxy.url}/admin/sessions/agent-1", headers=admin) as response:
        assert response.status == 200
        record = (await response.json())["records"][0]
    assert record["reason"] == "trigger" and record["path"] == "llm"
    assert record["dialect"] == "chat"
    assert record["tokens_after"] < record["tokens_before"]
    assert record["folded_messages"] > 0 and record["quality"] in {"good", "acceptable", "poor"}
    assert "standard library" in record["summary_preview"]
    async with client.get(f"{proxy.url}/metrics") as response:
        text = (await response.read()).decode()
    assert (
        'compaction_proxy_compactions_total{dialect="chat",path="llm",reason="trigger"} 1.0' in text
    )
    saved = float(record["tokens_before"] - record["tokens_after"])
    assert f"compaction_proxy_tokens_saved_total {saved}" in text.splitlines()


async def test_a_streamed_request_is_compacted_and_streamed_back(
    start: Any, script: Script, client: Any
) -> None:
    from tests.fakes.upstream import chat_chunk, sse_events, stream_reply

    proxy = await start()
    streaming = stream_reply(sse_events(chat_chunk("Hel"), chat_chunk("lo", finish=True)))

    async def chat(request: web.Request) -> web.StreamResponse:
        return await streaming(request, script.upstream)

    script.chat = chat
    messages = conversation_of(int(WINDOW * 1.2))
    body = {
        "model": "gpt-test",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.post(f"{proxy.url}/v1/chat/completions", json=body) as response:
        assert response.headers["x-compaction-status"] == "applied"
        payload = await response.read()
    assert b"Hel" in payload and b"[DONE]" in payload
    sent = forwarded(script)[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "body",
    [
        b"{not json" + b" " * 5000,
        b"[1, 2, 3]" + b" " * 5000,
        orjson.dumps({"model": "m", "messages": "nope", "pad": "x" * 5000}),
    ],
)
async def test_odd_chat_bodies_are_forwarded_untouched(
    body: bytes, start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 200
    assert script.calls(None)[0].body == body


async def test_a_coding_trajectory_replays_within_the_window(
    start: Any, script: Script, client: Any, corpus_dir: Path
) -> None:
    window = 8000
    proxy = await start(
        models={"default_context_window": window},
        compaction={"keep_recent_rounds": 5, "summary_max_tokens": 2000},
    )
    conversations = list(read_corpus(corpus_dir / "swe_mini_gemini3pro_toolcalls.jsonl"))
    conversations.sort(key=lambda c: len(c["messages"]))
    trajectory = conversations[len(conversations) * 3 // 4]
    history = trajectory["messages"]
    prefixes = [
        history[: i + 1]
        for i, m in enumerate(history)
        if m["role"] in ("user", "tool")
        and (i + 1 == len(history) or history[i + 1]["role"] != "tool")
    ]
    for prefix in prefixes:
        response = await post(client, proxy, prefix, session="replay", tools=trajectory["tools"])
        assert response.status == 200
    sent = forwarded(script)
    assert len(sent) == len(prefixes)
    for request in sent:
        assert check_tool_pairing(request["messages"]) == []
        assert tokens(request["messages"], request["tools"]) <= window
    summaries = len(script.calls("summary"))
    growth = tokens(history, trajectory["tools"]) - tokens(prefixes[0], trajectory["tools"])
    assert 1 <= summaries <= 2 + growth // int(window * 0.1)
    assert summaries < len(prefixes) / 3


async def test_many_sessions_compact_at_once_each_with_its_own_summary(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()

    async def echo_session(request: web.Request) -> web.StreamResponse:
        transcript = (await request.json())["messages"][-1]["content"]
        marker = next(
            word.rstrip(".") for word in transcript.split() if word.startswith("session-")
        )
        await asyncio.sleep(0.05)
        return web.json_response(chat_completion(f"## Facts\n- This is {marker} and nothing else."))

    script.summary = echo_session
    conversations = {}
    for n in range(20):
        messages = conversation_of(int(WINDOW * 1.2))
        messages[4] = f.user(f"I am session-{n:02d}. Please fix the failing test.")
        conversations[f"s{n:02d}"] = messages
    responses = await asyncio.gather(
        *(post(client, proxy, m, session=s) for s, m in conversations.items())
    )
    assert all(r.headers["x-compaction-status"] == "applied" for r in responses)
    assert len(script.calls("summary")) == 20
    for request in script.calls(None):
        sent = request.json()
        session = request.headers["X-Session-Id"]
        assert f"This is session-{session[1:]} and nothing else" in sent["messages"][1]["content"]
        assert sent["messages"][-3:] == conversations[session][-3:]
        assert check_tool_pairing(sent["messages"]) == []
