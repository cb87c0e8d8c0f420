"""Compaction through the real proxy, end to end: what the upstream receives near the window."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from bench.corpus import read_corpus
from compaction import SUMMARY_MARKER, HeuristicEstimator, is_summary_message
from compaction.invariants import check_tool_pairing
from compaction.tokens import estimate_request
from tests import factories as f
from tests.fakes.upstream import FakeUpstream, Recorded, chat_completion
from tests.proxy.conftest import RunningProxy, StartProxy

WINDOW = 4000
ESTIMATOR = HeuristicEstimator()
SUMMARY_TEXT = (
    "## Goals and requests\n- The user wants the failing tests fixed.\n"
    "## Decisions\n- Keep the standard library only.\n## Current state\n- Work continues."
)
MEMORY_TEXT = '[{"type": "decision", "content": "Keep the standard library only."}]'
PURPOSE = "X-Compaction-Purpose"


class Script:
    """Answers summary and memory calls from the proxy, and chat calls from the agent."""

    def __init__(self, upstream: FakeUpstream) -> None:
        self.upstream = upstream
        self.summary: Callable[[web.Request], Awaitable[web.StreamResponse]] = self.answer(
            SUMMARY_TEXT
        )
        self.memory = self.answer(MEMORY_TEXT)
        self.chat = self.counted("Done.")
        upstream.reply(self._dispatch)

    @staticmethod
    def answer(
        text: str, usage: dict[str, int] | None = None
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def reply(request: web.Request) -> web.StreamResponse:
            return web.json_response(chat_completion(text, usage))

        return reply

    @staticmethod
    def counted(text: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A chat answer whose usage reports what our estimator counts (a calibrated upstream)."""

        async def reply(request: web.Request) -> web.StreamResponse:
            try:
                payload = orjson.loads(await request.read())
                prompt = tokens(payload["messages"], payload.get("tools"))
            except (orjson.JSONDecodeError, TypeError, KeyError):
                prompt = 1  # not a chat request: the proxy forwarded it untouched
            usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
            return web.json_response(chat_completion(text, usage))

        return reply

    async def _dispatch(self, request: web.Request, upstream: FakeUpstream) -> web.StreamResponse:
        purpose = request.headers.get(PURPOSE)
        if purpose == "summary":
            return await self.summary(request)
        if purpose == "memory":
            return await self.memory(request)
        return await self.chat(request)

    def calls(self, purpose: str | None) -> list[Recorded]:
        return [r for r in self.upstream.requests if r.headers.get(PURPOSE) == purpose]


@pytest.fixture
def script(upstream: FakeUpstream) -> Script:
    return Script(upstream)


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    """A proxy with a small window, memory under tmp_path, and an admin token."""

    async def run(**sections: Any) -> RunningProxy:
        settings: dict[str, dict[str, Any]] = {
            "models": {"default_context_window": WINDOW},
            "compaction": {
                "keep_recent_rounds": 2,
                "summary_max_tokens": 300,
                "precompute_ratio": 0,
            },
            "memory": {"dir": str(tmp_path / "memory")},
            "admin": {"token": "admin-secret"},
        }
        for section, values in sections.items():
            settings.setdefault(section, {}).update(values)
        return await start_proxy(**settings)

    return run


def tokens(messages: list[Any], tools: Any = None) -> int:
    return estimate_request(messages, tools, ESTIMATOR)


def conversation_of(
    target_tokens: int, *, grow: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A coding-agent history of roughly `target_tokens` ending in a user message; with `grow`,
    that history (its last message dropped) continued."""
    messages: list[dict[str, Any]] = grow[:-1] if grow else [f.system()]
    i = len(messages)
    while tokens(messages) < target_tokens:
        messages += f.tool_round(i, blocks=1, output_chars=300)
        i += 1
    messages.append(f.user(f"Now summarize round {i} for me."))
    return messages


async def post(
    client: aiohttp.ClientSession,
    proxy: RunningProxy,
    messages: list[Any],
    *,
    session: str = "agent-1",
    auth: str = "Bearer sk-client",
    **fields: Any,
) -> aiohttp.ClientResponse:
    body = orjson.dumps({"model": "gpt-test", "messages": messages, **fields})
    headers = {"Content-Type": "application/json", "Authorization": auth, "X-Session-Id": session}
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        await response.read()
        return response


def forwarded(script: Script) -> list[dict[str, Any]]:
    return [r.json() for r in script.calls(None)]


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
    proxy = await start()
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
    kept_from = user_starts[-2]  # keep_recent_rounds = 2
    assert out[2:] == messages[kept_from:]
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


async def test_follow_up_requests_reuse_the_checkpoint_with_a_byte_identical_prefix(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 1.1))
    await post(client, proxy, messages)
    messages = [*messages, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    second = await post(client, proxy, messages)
    assert second.headers["x-compaction-status"] == "reused"
    assert len(script.calls("summary")) == 1
    first_out, second_out = (sent["messages"] for sent in forwarded(script))
    assert orjson.dumps(first_out[:2]) == orjson.dumps(second_out[:2])
    assert second_out[-2:] == messages[-2:]


async def test_concurrent_identical_requests_share_one_summarization(
    start: Any, script: Script, client: Any
) -> None:
    from proxy import keys

    proxy = await start()
    answer = Script.answer(SUMMARY_TEXT)
    in_flight = proxy.app[keys.METRICS].in_flight

    async def held_summary(request: web.Request) -> web.StreamResponse:
        # Answer only once all ten requests are inside the proxy, so they surely overlap.
        await _wait_for(lambda: in_flight._value.get() == 10)
        return await answer(request)

    script.summary = held_summary
    messages = conversation_of(int(WINDOW * 1.2))
    responses = await asyncio.gather(*(post(client, proxy, messages) for _ in range(10)))
    assert [r.status for r in responses] == [200] * 10
    assert len(script.calls("summary")) == 1
    bodies = {orjson.dumps(sent["messages"]) for sent in forwarded(script)}
    assert len(bodies) == 1


def _failing(kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def reply(request: web.Request) -> web.StreamResponse:
        if kind == "down":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if kind == "slow":
            await asyncio.sleep(5)
        text = {"empty": "", "nonsense": "!!!", "slow": SUMMARY_TEXT}[kind]
        return web.json_response(chat_completion(text))

    return reply


@pytest.mark.parametrize("kind", ["down", "slow", "empty", "nonsense"])
async def test_a_failing_summarizer_never_fails_the_request(
    kind: str, start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"summary_timeout_s": 0.5})
    script.summary = _failing(kind)
    script.memory = _failing(kind)
    messages = conversation_of(int(WINDOW * 1.3))
    response = await post(client, proxy, messages)
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    out = forwarded(script)[0]["messages"]
    assert is_summary_message(out[1])
    assert check_tool_pairing(out) == []
    assert tokens(out) < 0.85 * WINDOW


async def test_repeated_summarizer_failures_cool_down(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"failure_threshold": 2, "failure_cooldown_s": 600})
    script.summary = _failing("down")
    for n in range(4):
        response = await post(
            client,
            proxy,
            [*conversation_of(int(WINDOW * 1.2)), f.user(f"new {n}")],
            session=f"s{n}",
        )
        assert response.status == 200 and response.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 2
    # Another tenant's key is not cooled down by the first one's failures.
    await post(
        client, proxy, conversation_of(int(WINDOW * 1.2)), session="t", auth="Bearer sk-other"
    )
    assert len(script.calls("summary")) == 3


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
        messages[1] = f.user(f"The code word is {secret}. Please fix the failing test.")
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


async def _wait_for(condition: Callable[[], bool], timeout_s: float = 5) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def test_precompute_prepares_the_checkpoint_before_the_trigger(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6, "summary_timeout_s": 5})
    messages = conversation_of(int(WINDOW * 0.7))
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "none"
    assert script.calls(None)[0].body == orjson.dumps({"model": "gpt-test", "messages": messages})
    await _wait_for(lambda: len(proxy.app[_records_key()].get("agent-1")["records"]) == 1)

    blocked = asyncio.Event()

    async def never(request: web.Request) -> web.StreamResponse:
        await blocked.wait()
        raise AssertionError("unreachable")

    script.summary = never  # a request that had to summarize now would time out
    grown = conversation_of(int(WINDOW * 0.88), grow=messages)
    response = await post(client, proxy, grown)
    assert response.headers["x-compaction-status"] == "reused", response.headers
    assert len(script.calls("summary")) == 1
    record = proxy.app[_records_key()].get("agent-1")["records"][0]
    assert record["reason"] == "precompute"


def _records_key() -> Any:
    from proxy import keys

    return keys.RECORDS


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
    assert record["tokens_after"] < record["tokens_before"]
    assert record["folded_messages"] > 0 and record["quality"] in {"good", "acceptable", "poor"}
    assert "standard library" in record["summary_preview"]
    async with client.get(f"{proxy.url}/metrics") as response:
        text = (await response.read()).decode()
    assert 'compaction_proxy_compactions_total{path="llm",reason="trigger"} 1.0' in text
    assert "compaction_proxy_tokens_saved_total" in text


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


def _calibration(proxy: RunningProxy) -> Any:
    from proxy import keys

    return proxy.app[keys.CHAT_PIPELINE].calibration  # type: ignore[attr-defined]


async def test_a_precomputed_checkpoint_waits_in_reserve_until_the_trigger(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6})
    records = proxy.app[_records_key()]
    messages = conversation_of(int(WINDOW * 0.9))
    first = await post(client, proxy, messages)  # over the trigger: compacted now
    assert first.headers["x-compaction-status"] == "applied"
    first_id = first.headers["x-compaction-id"]
    # Grow until the forwarded view passes the precompute ratio, so a reserve gets prepared.
    while True:
        messages = conversation_of(tokens(messages) + 150, grow=messages)
        response = await post(client, proxy, messages)
        if int(response.headers["x-compaction-tokens-after"]) >= 0.6 * WINDOW:
            break
    await _wait_for(lambda: len(records.get("agent-1")["records"]) == 2)
    assert records.get("agent-1")["records"][1]["reason"] == "precompute"
    # Below the trigger, the view built on the first checkpoint is still what goes upstream.
    messages = [*messages, f.assistant("ok"), f.user("next")]
    response = await post(client, proxy, messages)
    assert int(response.headers["x-compaction-tokens-after"]) < 0.85 * WINDOW
    assert response.headers["x-compaction-id"] == first_id
    # Once that view reaches the trigger, the reserve is used without a new summary.
    summaries = len(script.calls("summary"))
    messages = conversation_of(int(tokens(messages) + 0.3 * WINDOW), grow=messages)
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "reused"
    assert response.headers["x-compaction-id"] == records.get("agent-1")["records"][1]["id"]
    assert len(script.calls("summary")) == summaries


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
    response = await post(client, proxy, conversation_of(int(WINDOW * 0.75)))
    assert response.status == 200 and len(script.calls(None)) == 2
    assert _calibration(proxy).factor("gpt-test") == pytest.approx(1.5, rel=0.05)


async def test_azure_style_keys_reach_the_summarizer(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    body = orjson.dumps({"model": "gpt-test", "messages": conversation_of(int(WINDOW * 1.2))})
    headers = {"Content-Type": "application/json", "api-key": "azure-secret", "X-Session-Id": "az"}
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        assert response.headers["x-compaction-status"] == "applied"
    summary = script.calls("summary")[0]
    assert summary.headers["api-key"] == "azure-secret"
    assert "Authorization" not in summary.headers


async def test_a_quiet_conversation_does_not_silence_another_in_the_same_session(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6})
    records = proxy.app[_records_key()]
    a = conversation_of(int(WINDOW * 0.75))
    await post(client, proxy, a)
    await _wait_for(lambda: len(records.get("agent-1")["records"]) == 1)
    await post(client, proxy, conversation_of(tokens(a) + 100, grow=a))  # finds the reserve: quiet
    b = conversation_of(int(WINDOW * 0.7))
    b[1] = f.user("A different task altogether.")
    await post(client, proxy, b)
    await _wait_for(lambda: len(records.get("agent-1")["records"]) == 2)
    assert [r["reason"] for r in records.get("agent-1")["records"]] == ["precompute", "precompute"]


async def test_a_client_that_leaves_during_a_summary_does_not_waste_it(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    release = asyncio.Event()
    answer = Script.answer(SUMMARY_TEXT)

    async def gated(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return await answer(request)

    script.summary = gated
    messages = conversation_of(int(WINDOW * 1.2))
    leaving = asyncio.ensure_future(post(client, proxy, messages))
    await _wait_for(lambda: len(script.calls("summary")) == 1)
    leaving.cancel()  # the client goes away while its request waits for the summary
    with pytest.raises(asyncio.CancelledError):
        await leaving
    release.set()
    records = proxy.app[_records_key()]
    await _wait_for(lambda: len((records.get("agent-1") or {"records": []})["records"]) == 1)
    again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    assert again.headers["x-compaction-status"] == "reused"
    assert len(script.calls("summary")) == 1


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
        messages[1] = f.user(f"I am session-{n:02d}. Please fix the failing test.")
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


async def test_a_reasoning_model_that_refuses_max_tokens_and_temperature_still_summarizes(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    answer = Script.answer(SUMMARY_TEXT)

    async def strict(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        for param, code in (
            ("max_tokens", "unsupported_parameter"),
            ("temperature", "unsupported_value"),
        ):
            if param in payload:
                return web.json_response(
                    {
                        "error": {
                            "message": f"Unsupported parameter: '{param}' is not supported with this model.",
                            "type": "invalid_request_error",
                            "param": param,
                            "code": code,
                        }
                    },
                    status=400,
                )
        assert "max_completion_tokens" in payload
        return await answer(request)

    script.summary = strict
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.2)))
    assert response.headers["x-compaction-status"] == "applied"
    assert proxy.app[_records_key()].get("agent-1")["records"][0]["path"] == "llm"
    # Learned once per model: the next conversation's summary call is right the first time.
    calls = len(script.calls("summary"))
    await post(client, proxy, conversation_of(int(WINDOW * 1.2)), session="second")
    assert len(script.calls("summary")) == calls + 1


async def test_a_summary_that_outlives_its_request_is_used_once_it_lands(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"summary_timeout_s": 0.3})
    answer = Script.answer(SUMMARY_TEXT)

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.6)  # longer than a request waits, shorter than the call may take
        return await answer(request)

    script.summary = slow
    messages = conversation_of(int(WINDOW * 1.2))
    first = await post(client, proxy, messages)
    assert first.headers["x-compaction-status"] == "applied"
    assert (
        "The user wants the failing tests fixed"
        not in forwarded(script)[0]["messages"][1]["content"]
    )
    records = proxy.app[_records_key()]
    await _wait_for(lambda: bool((records.get("agent-1") or {"records": []})["records"]))
    record = records.get("agent-1")["records"][0]
    assert record["path"] == "llm"
    second = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    assert second.headers["x-compaction-status"] == "reused"
    assert second.headers["x-compaction-id"] == record["id"]
    assert (
        "The user wants the failing tests fixed" in forwarded(script)[1]["messages"][1]["content"]
    )
