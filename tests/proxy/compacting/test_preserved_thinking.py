"""Claude's preserved thinking through compaction, against a strict fake of Anthropic's rules
(tests/fakes/anthropic_strict.py: platform docs `build-with-claude/preserved-thinking`,
`.../preserved-thinking/prefix-checks`, `.../fix-bound-to-a-different-conversation`).

A Claude Code-shaped tool loop (thinking enabled with a 31,999 budget, `max_tokens` 32,000,
every thinking block sent back on every turn) grows past the trigger several times: on a model
that binds thinking to its prefix, no request (the agent's or the proxy's summary calls) is
refused, and the thinking written after a compaction reaches the model readable while that
compaction is reused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.compacting.decision.thinking import BoundThinking
from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.settings import ModelsSettings
from tests.fakes.anthropic_strict import BINDING_BETA, StrictAnthropic, thinking_then_tool
from tests.proxy.compacting.conftest import small_window_proxies
from tests.proxy.conftest import RunningProxy, StartProxy

WINDOW = 64_000
BOUND_MODEL = "claude-opus-5-5"
OLDER_MODEL = "claude-sonnet-4-5"
HEADERS = {
    "Content-Type": "application/json",
    "x-api-key": "sk-ant-client",
    "anthropic-version": "2023-06-01",
}
SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
TOOLS = [
    {"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object"}},
    {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"}},
]
OUTPUT = "collected 214 items; tests/test_parser.py::test_nested FAILED at line 88\n" * 40


@pytest.fixture
async def api() -> AsyncIterator[StrictAnthropic]:
    async with StrictAnthropic(window=WINDOW) as fake:
        yield fake


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    return small_window_proxies(start_proxy, tmp_path, recall="on")


async def proxy_for(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    *,
    state: dict[str, Any] | None = None,
    **models: Any,
) -> RunningProxy:
    """A proxy in front of `api` (`state`: its state section; default in the process)."""
    return await start(
        upstream={"anthropic_base_url": api.base_url},
        state=state or {"backend": "memory"},
        models={"default_context_window": WINDOW, **models},
        # Compacted where prompt + the client's 32,000 reach the window (the estimate, the
        # recall tool included, must not fall short of the upstream's count there).
        compaction={
            "summary_max_tokens": 1000,
            "keep_recent_rounds": 2,
            "strategy": "summary",  # every compaction asks the model: summary calls are checked
        },
    )


def claude_code_body(model: str, messages: list[Any], **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 32_000,
        "thinking": {"type": "enabled", "budget_tokens": 31_999},
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": messages,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        **fields,
    }


async def send(
    client: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async with client.post(
        f"{url}/v1/messages", data=orjson.dumps(body), headers={**HEADERS, **headers}
    ) as response:
        return response.status, dict(response.headers), await response.read()


def streamed_message(raw: bytes) -> dict[str, Any]:
    """The message an SSE stream of Anthropic events spells out."""
    message: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for chunk in raw.split(b"\n\n"):
        data = [line[6:] for line in chunk.split(b"\n") if line.startswith(b"data: ")]
        if not data:
            continue
        event = orjson.loads(data[0])
        kind = event["type"]
        if kind == "message_start":
            message = event["message"]
        elif kind == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
    for index, text in partial.items():
        blocks[index]["input"] = orjson.loads(text) if text else {}
    return {**message, "content": blocks}


async def tool_loop(
    client: aiohttp.ClientSession,
    proxy: RunningProxy,
    model: str,
    turns: int,
    *,
    stream: bool = False,
    session: str = "cc-1",
    messages: list[Any] | None = None,
) -> list[tuple[int, dict[str, str]]]:
    """Drive a Claude Code-shaped loop for `turns` requests; every answer's blocks go back
    verbatim, each tool call answered with a long output (`messages`: the client's history,
    grown in place)."""
    if messages is None:
        messages = []
    if not messages:
        messages.append({"role": "user", "content": [{"type": "text", "text": "Fix the tests."}]})
    seen: list[tuple[int, dict[str, str]]] = []
    for _ in range(turns):
        body = claude_code_body(model, messages, stream=stream)
        status, headers, raw = await send(client, proxy.url, body, **{"X-Session-Id": session})
        seen.append((status, headers))
        if status != 200:
            break
        answer = streamed_message(raw) if stream else orjson.loads(raw)
        messages.append({"role": "assistant", "content": answer["content"]})
        uses = [b for b in answer["content"] if b["type"] == "tool_use"]
        results = [{"type": "tool_result", "tool_use_id": u["id"], "content": OUTPUT} for u in uses]
        messages.append(
            {"role": "user", "content": results or [{"type": "text", "text": "Go on."}]}
        )
    return seen


# -- the strict fake itself ------------------------------------------------------------------


async def test_the_strict_fake_refuses_an_edited_prefix_and_drops_with_the_beta(
    api: StrictAnthropic, client: aiohttp.ClientSession
) -> None:
    first = [{"role": "user", "content": "Hello."}]
    status, _, raw = await send(client, api.base_url[:-3], claude_code_body(BOUND_MODEL, first))
    assert status == 200
    answer = orjson.loads(raw)
    history = [*first, {"role": "assistant", "content": answer["content"]}]
    follow = [*history, {"role": "user", "content": "And then?"}]
    # Sent back as produced, a cache marker moved: valid.
    moved = [{**follow[0], "content": [{"type": "text", "text": "Hello.",
                                         "cache_control": {"type": "ephemeral"}}]}, *follow[1:]]  # fmt: skip
    assert (await send(client, api.base_url[:-3], claude_code_body(BOUND_MODEL, moved)))[0] == 200
    # An edit before the block: the documented 400.
    edited = [{"role": "user", "content": "Hello!"}, *follow[1:]]
    status, _, raw = await send(client, api.base_url[:-3], claude_code_body(BOUND_MODEL, edited))
    assert status == 400
    message = orjson.loads(raw)["error"]["message"]
    assert message.startswith("messages.1.content.0: Invalid `signature` in `thinking` block.")
    assert "bound to a different conversation" in message
    # drop_block needs its beta; with it the block is dropped and the request answered.
    binding = {"type": "enabled", "budget_tokens": 31_999,
               "block_binding": {"prefix_mismatch_behavior": "drop_block"}}  # fmt: skip
    dropping = claude_code_body(BOUND_MODEL, edited, thinking=binding)
    assert (await send(client, api.base_url[:-3], dropping))[0] == 400
    beta = {"anthropic-beta": BINDING_BETA}
    assert (await send(client, api.base_url[:-3], dropping, **beta))[0] == 200
    assert api.dropped == 1
    # An older model reads whatever comes back.
    assert (await send(client, api.base_url[:-3], claude_code_body(OLDER_MODEL, edited)))[0] == 200


async def test_the_strict_fake_refuses_a_request_over_its_window_or_budget(
    api: StrictAnthropic, client: aiohttp.ClientSession
) -> None:
    long = [{"role": "user", "content": "word " * 150_000}]
    assert (await send(client, api.base_url[:-3], claude_code_body(BOUND_MODEL, long)))[0] == 400
    short = [{"role": "user", "content": "Hi."}]
    budget = {"type": "enabled", "budget_tokens": 4096}
    body = claude_code_body(BOUND_MODEL, short, max_tokens=4096, thinking=budget)
    assert (await send(client, api.base_url[:-3], body))[0] == 400
    assert [r.message for r in api.refused][-1].startswith("`max_tokens` must be greater")


# -- through the proxy -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_claude_code_loop_on_a_bound_model_is_never_refused(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
    stream: bool,
) -> None:
    proxy = await proxy_for(start, api)
    seen = await tool_loop(client, proxy, BOUND_MODEL, 140, stream=stream)
    assert [status for status, _ in seen] == [200] * 140
    assert api.refused == []  # neither the agent's requests nor the summary calls
    assert len(api.own_calls) >= 3
    ids = {h.get("x-compaction-id") for _, h in seen if h.get("x-compaction-id")}
    assert len(ids) >= 3  # grown past the trigger several times
    assert api.readable > 0  # thinking written after a compaction is read while it is reused


async def test_the_compacted_prefix_and_tools_are_byte_stable_while_a_compaction_is_reused(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    proxy = await proxy_for(start, api)
    seen = await tool_loop(client, proxy, BOUND_MODEL, 60)
    agent = api.requests
    by_compaction: dict[str, list[dict[str, Any]]] = {}
    for (_, headers), request in zip(seen, agent, strict=True):
        if "x-compaction-id" in headers:
            by_compaction.setdefault(headers["x-compaction-id"], []).append(request)
    assert by_compaction
    for requests in by_compaction.values():
        first = requests[0]
        assert [t["name"] for t in first["tools"]] == ["Bash", "Read", "recall"]
        for later in requests[1:]:
            assert later["tools"] == first["tools"]
            count = len(first["messages"])
            assert later["messages"][:count] == first["messages"]


async def test_a_bound_model_not_configured_is_learned_from_one_refusal_the_client_never_sees(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    proxy = await proxy_for(start, api, preserved_thinking=[])
    seen = await tool_loop(client, proxy, BOUND_MODEL, 50)
    assert [status for status, _ in seen] == [200] * 50
    agent_refusals = [r for r in api.refused if r.purpose is None]
    assert len(agent_refusals) == 1
    assert "bound to a different conversation" in agent_refusals[0].message
    async with client.get(f"{proxy.url}/metrics") as response:
        metrics = await response.text()
    assert "compaction_proxy_thinking_refused_total 1.0" in metrics


async def test_an_older_model_keeps_its_thinking_byte_for_byte(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    proxy = await proxy_for(start, api)
    messages: list[Any] = []
    seen = await tool_loop(client, proxy, OLDER_MODEL, 50, messages=messages)
    assert [status for status, _ in seen] == [200] * 50
    assert seen[-1][1]["x-compaction-status"] in ("applied", "reused")
    kept = api.requests[-1]["messages"][1:]  # all but the summary's turn
    assert kept == messages[: len(messages) - 2][-len(kept) :]  # the last request's history
    assert sum(b["type"] == "thinking" for m in kept for b in m["content"]) >= 5


async def test_the_summary_call_fits_the_window_whatever_the_client_asks(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
) -> None:
    # Compacted where prompt + the client's 32,000 reach the window: a summary call asking the
    # client's thinking budget on top would be refused as over the window (issue 34).
    proxy = await start(
        upstream={"anthropic_base_url": api.base_url},
        models={"default_context_window": WINDOW},
        compaction={"strategy": "summary", "keep_recent_rounds": 2},
    )
    seen = await tool_loop(client, proxy, BOUND_MODEL, 48)
    assert [status for status, _ in seen] == [200] * 48
    assert api.own_calls  # the summarizer was asked
    assert [r for r in api.refused if r.purpose is not None] == []
    for call in api.own_calls:
        assert call["max_tokens"] < 32_000
        assert call["thinking"]["budget_tokens"] < call["max_tokens"]


def recalling_turn(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Think, then call `recall` while it is offered and not yet answered; then think and
    answer from its result."""
    answered = [
        b["content"]
        for m in payload["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b["tool_use_id"].startswith("toolu_recall")
    ]
    offered = any(t["name"] == "recall" for t in payload.get("tools") or [])
    if offered and not answered:
        return [
            {"type": "thinking", "thinking": "I folded that away; recall it."},
            {"type": "text", "text": "Let me check. "},
            {"type": "tool_use", "id": "toolu_recall1", "name": "recall",
             "input": {"query": "test_parser"}},
        ]  # fmt: skip
    return [
        {"type": "thinking", "thinking": "The recalled output answers it."},
        {"type": "text", "text": f"Found it: {str(answered[-1])[:40] if answered else 'no'}"},
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_after_a_recall_round_the_clients_next_request_passes_the_prefix_check(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
    stream: bool,
) -> None:
    proxy = await proxy_for(start, api)
    session = f"rounds-{stream}"
    messages: list[Any] = []
    seen = await tool_loop(client, proxy, BOUND_MODEL, 46, session=session, messages=messages)
    assert seen[-1][1].get("x-compaction-status") in ("applied", "reused")
    messages.pop()  # the last answer's tool call, answered below by the client instead
    messages.pop()
    messages.append({"role": "user", "content": [{"type": "text", "text": "Why did it fail?"}]})
    api.turn = recalling_turn
    body = claude_code_body(BOUND_MODEL, messages, stream=stream)
    status, headers, raw = await send(client, proxy.url, body, **{"X-Session-Id": session})
    assert status == 200 and (stream or headers.get("x-compaction-recall-rounds") == "1")
    answer = streamed_message(raw) if stream else orjson.loads(raw)
    assert answer["content"][0]["type"] == "thinking"
    assert all(b.get("name") != "recall" for b in answer["content"])
    # The client's next request sends the message back as it got it: nothing is refused.
    api.turn = thinking_then_tool
    after = [*messages, {"role": "assistant", "content": answer["content"]},
             {"role": "user", "content": [{"type": "text", "text": "Thanks, go on."}]}]  # fmt: skip
    body = claude_code_body(BOUND_MODEL, after, stream=stream)
    status, _, _ = await send(client, proxy.url, body, **{"X-Session-Id": session})
    assert status == 200
    assert api.refused == []


def test_stale_thinking_goes_and_a_turn_of_thinking_alone_goes_with_it() -> None:
    bound = BoundThinking(ModelsSettings(), max_entries=8)
    thought = {"type": "thinking", "thinking": "hm", "signature": "sig-1"}
    said = {"type": "text", "text": "Done."}
    original: list[Any] = [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "content": [thought]},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": [thought, said]},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": [thought, said]},
    ]
    summary = {"role": "user", "content": "[summary]"}
    view = [summary, *original[1:]]
    out = bound.strip(ANTHROPIC_MESSAGES, original, view, fresh_from=5)
    assert out == [
        summary,
        original[2],
        {"role": "assistant", "content": [said]},
        original[4],
        original[5],  # answered on the compacted prefix: kept, the same object
    ]
    assert out[-1] is original[-1]
    assert bound.strip(ANTHROPIC_MESSAGES, original, view, fresh_from=0) is view
