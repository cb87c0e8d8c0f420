"""The clients' and the providers' own compaction is left alone, through real HTTP, over the
trigger, with recall on: each such request reaches the upstream byte-identical, with no recall
tool, and says why (`x-compaction-status: skipped`, `x-compaction-reason`).

The requests, as their clients and docs shape them:
- Codex's remote compaction (`x-codex-beta-features: remote_compaction_v2`): an ordinary
  `POST /v1/responses` whose last input item is `{"type": "compaction_trigger"}` and whose
  `x-codex-turn-metadata` says `"request_kind": "compaction"`.
- Codex's local handoff: the history, then a user message opening "You are performing a CONTEXT
  CHECKPOINT COMPACTION" (codex-rs templates/compact/prompt.md), with `tools: []`.
- OpenAI's server-side compaction: `context_management: [{"type": "compaction",
  "compact_threshold": N}]` (developers.openai.com/api/docs/guides/compaction).
- Anthropic on demand: top-level `"compaction": {"type": "summarize"}` with the beta
  `compact-2026-09-04` (platform.claude.com/docs/en/build-with-claude/compaction-on-demand); at a
  threshold: a `context_management.edits` entry `compact_20260112` (platform.claude.com/docs/en/
  build-with-claude/compaction-threshold).
- Claude Code's /compact: the history, then a user turn asking "Your task is to create a
  detailed summary of the conversation so far, ...".
A request the client sent with no `tools` (or `tools: []`) never gets the recall tool either.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.dialects import to_anthropic, to_responses
from tests import factories as f
from tests.fakes.script import Script, body_tokens
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import WINDOW, small_window_proxies
from tests.proxy.conftest import RunningProxy, StartProxy

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
CODEX_COMPACTION_HEADERS = {
    "x-codex-beta-features": "remote_compaction_v2",
    "x-codex-turn-metadata": orjson.dumps(
        {"turn_id": "t-7", "request_kind": "compaction", "sandbox": "workspace-write"}
    ).decode(),
}
HANDOFF_PROMPT = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another "
    "LLM that will resume the task.\n\nInclude:\n- Current progress and key decisions made"
)
CLAUDE_CODE_SUMMARY_PROMPT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n"
    "- Do NOT use Read, Bash, Grep, Glob, Edit, Write, or ANY other tool.\n\n"
    "Your task is to create a detailed summary of the conversation so far, paying close "
    "attention to the user's explicit requests and your previous actions."
)


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    return small_window_proxies(start_proxy, tmp_path, recall="on")


@pytest.fixture
def script(upstream: FakeUpstream) -> Script:
    return Script(upstream)


def history(target_tokens: int, path: str) -> list[dict[str, Any]]:
    """A coding agent's chat history of about `target_tokens` as the API at `path` counts it."""
    messages: list[dict[str, Any]] = [f.system(), f.user("Start the work.")]
    i = 0
    while body_tokens(path, shaped(path, messages)) < target_tokens:
        messages += f.tool_round(i, blocks=2, output_chars=300)
        i += 1
    return messages


def shaped(path: str, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    if path.endswith("/responses"):
        return {**to_responses(messages, TOOLS), **fields}
    if path.endswith("/messages"):
        return {**to_anthropic(messages, TOOLS), **fields}
    return {"model": "gpt-test", "messages": messages, "tools": TOOLS, **fields}


def responses_user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def send(
    client: Any, proxy: RunningProxy, path: str, raw: bytes, **headers: str
) -> tuple[Any, bytes]:
    sent = {"Content-Type": "application/json", "Authorization": "Bearer sk-client", **headers}
    if path.endswith("/messages"):
        sent.update(ANTHROPIC_HEADERS)
    async with client.post(f"{proxy.url}{path}", data=raw, headers=sent) as response:
        return response, await response.read()


def spaced(payload: dict[str, Any]) -> bytes:
    """The client's bytes, spaced as no serializer of ours would write them."""
    return orjson.dumps(payload).replace(b'","', b'", "')


def tool_names(payload: dict[str, Any]) -> list[str]:
    names = []
    for tool in payload.get("tools") or []:
        function = tool.get("function")
        names.append(function["name"] if isinstance(function, dict) else tool.get("name"))
    return names


async def assert_stepped_aside(
    client: Any,
    proxy: RunningProxy,
    script: Script,
    path: str,
    payload: dict[str, Any],
    reason: str,
    **headers: str,
) -> None:
    assert body_tokens(path, payload) > 0.85 * WINDOW  # over the trigger
    raw = spaced(payload)
    response, _ = await send(client, proxy, path, raw, **{"X-Session-Id": "own", **headers})
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "skipped"
    assert response.headers["x-compaction-reason"] == reason
    (forwarded,) = script.calls(None)
    assert forwarded.body == raw  # byte-identical: no fold, no recall tool, nothing re-encoded
    assert script.calls("summary") == []


# ------------------------------------------------------------------------------ Codex


async def test_a_codex_compaction_trigger_request_reaches_the_upstream_byte_identical(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = history(int(WINDOW * 1.3), "/v1/responses")
    payload = shaped("/v1/responses", messages, store=False, stream=False)
    payload["input"].append({"type": "compaction_trigger"})
    await assert_stepped_aside(
        client,
        proxy,
        script,
        "/v1/responses",
        payload,
        "codex-compaction",
        **CODEX_COMPACTION_HEADERS,
    )


async def test_a_compaction_trigger_item_alone_is_enough_to_step_aside(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    payload = shaped("/v1/responses", history(int(WINDOW * 1.3), "/v1/responses"))
    payload["input"].append({"type": "compaction_trigger"})
    await assert_stepped_aside(client, proxy, script, "/v1/responses", payload, "codex-compaction")


async def test_a_codex_turn_whose_metadata_says_compaction_is_left_alone(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = history(int(WINDOW * 1.3), "/v1/responses")
    payload = shaped("/v1/responses", [*messages, f.user("Go on.")])
    await assert_stepped_aside(
        client,
        proxy,
        script,
        "/v1/responses",
        payload,
        "codex-compaction",
        **CODEX_COMPACTION_HEADERS,
    )


async def test_codex_local_handoff_request_is_left_alone(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    payload = shaped("/v1/responses", history(int(WINDOW * 1.3), "/v1/responses"), tools=[])
    payload["input"].append(responses_user(HANDOFF_PROMPT))
    await assert_stepped_aside(client, proxy, script, "/v1/responses", payload, "codex-handoff")


async def test_codex_handoff_over_chat_completions_is_left_alone(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = [*history(int(WINDOW * 1.3), "/v1/chat/completions"), f.user(HANDOFF_PROMPT)]
    payload = shaped("/v1/chat/completions", messages, tools=[])
    await assert_stepped_aside(
        client, proxy, script, "/v1/chat/completions", payload, "codex-handoff"
    )


async def test_a_responses_request_asking_for_server_side_compaction_is_left_alone(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    payload = shaped(
        "/v1/responses",
        history(int(WINDOW * 1.3), "/v1/responses"),
        context_management=[{"type": "compaction", "compact_threshold": 200000}],
    )
    await assert_stepped_aside(
        client, proxy, script, "/v1/responses", payload, "responses-context-management"
    )


async def test_a_remembered_conversation_steps_aside_for_its_compaction_trigger(
    start: Any, script: Script, client: Any
) -> None:
    # Long bodies are remembered and their next request answered from what is remembered (the
    # fast path): stepping aside is decided there too, not only on a full parse.
    window = 24_000
    proxy = await start(models={"default_context_window": window})
    messages = history(int(window * 1.1), "/v1/responses")
    first = shaped("/v1/responses", messages)
    assert len(orjson.dumps(first)) > 64 * 1024
    response, _ = await send(
        client, proxy, "/v1/responses", orjson.dumps(first), **{"X-Session-Id": "long"}
    )
    assert response.headers["x-compaction-status"] == "applied"
    later = shaped("/v1/responses", [*messages, *f.tool_round(99, blocks=1)])
    later["input"].append({"type": "compaction_trigger"})
    raw = spaced(later)
    response, _ = await send(
        client, proxy, "/v1/responses", raw, **{"X-Session-Id": "long"}, **CODEX_COMPACTION_HEADERS
    )
    assert response.headers["x-compaction-status"] == "skipped"
    assert script.calls(None)[-1].body == raw


# ------------------------------------------------------------------------------ Anthropic


@pytest.fixture
async def anthropic_proxy(start: Any, upstream: FakeUpstream) -> RunningProxy:
    proxy: RunningProxy = await start(upstream={"anthropic_base_url": upstream.base_url})
    return proxy


async def test_an_anthropic_on_demand_compaction_request_is_left_alone(
    anthropic_proxy: RunningProxy, script: Script, client: Any
) -> None:
    payload = shaped(
        "/v1/messages",
        history(int(WINDOW * 1.3), "/v1/messages"),
        compaction={"type": "summarize"},
    )
    await assert_stepped_aside(
        client,
        anthropic_proxy,
        script,
        "/v1/messages",
        payload,
        "anthropic-compaction",
        **{"anthropic-beta": "compact-2026-09-04"},
    )


async def test_an_anthropic_request_compacting_at_a_threshold_is_left_alone(
    anthropic_proxy: RunningProxy, script: Script, client: Any
) -> None:
    edits = [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000}},
    ]
    payload = shaped(
        "/v1/messages",
        history(int(WINDOW * 1.3), "/v1/messages"),
        context_management={"edits": edits},
    )
    await assert_stepped_aside(
        client,
        anthropic_proxy,
        script,
        "/v1/messages",
        payload,
        "anthropic-compact-edit",
        **{"anthropic-beta": "compact-2026-01-12"},
    )


async def test_claude_codes_own_summary_request_is_left_alone(
    anthropic_proxy: RunningProxy, script: Script, client: Any
) -> None:
    messages = history(int(WINDOW * 1.3), "/v1/messages")
    payload = shaped("/v1/messages", [*messages, f.user(CLAUDE_CODE_SUMMARY_PROMPT)])
    await assert_stepped_aside(
        client, anthropic_proxy, script, "/v1/messages", payload, "claude-code-summary"
    )


async def test_claude_codes_ordinary_turns_are_still_compacted(
    anthropic_proxy: RunningProxy, script: Script, client: Any
) -> None:
    # Claude Code sends a context_management edit on every turn (clearing thinking): that is no
    # compaction of its own, and its turns are compacted as ever.
    edits = [{"type": "clear_thinking_20251015", "keep": "all"}]
    messages = [*history(int(WINDOW * 1.3), "/v1/messages"), f.user("Go on.")]
    payload = shaped("/v1/messages", messages, context_management={"edits": edits})
    response, _ = await send(client, anthropic_proxy, "/v1/messages", orjson.dumps(payload))
    assert response.headers["x-compaction-status"] == "applied"
    assert "x-compaction-reason" not in response.headers


# ------------------------------------------------------------------------------ tools


@pytest.mark.parametrize(
    "fields",
    [{}, {"tools": []}],
    ids=["no tools field", "empty tools"],
)
async def test_a_request_sent_without_tools_never_gets_the_recall_tool(
    start: Any, script: Script, client: Any, fields: dict[str, Any]
) -> None:
    proxy = await start()
    messages = [*history(int(WINDOW * 1.3), "/v1/chat/completions"), f.user("Go on.")]
    payload = {"model": "gpt-test", "messages": messages, **fields}
    response, _ = await send(client, proxy, "/v1/chat/completions", orjson.dumps(payload))
    assert response.headers["x-compaction-status"] == "applied"
    sent = script.calls(None)[-1].json()
    assert sent.get("tools") == fields.get("tools")


async def test_a_request_with_tools_still_gets_the_recall_tool(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = [*history(int(WINDOW * 1.3), "/v1/chat/completions"), f.user("Go on.")]
    payload = shaped("/v1/chat/completions", messages)
    response, _ = await send(client, proxy, "/v1/chat/completions", orjson.dumps(payload))
    assert response.headers["x-compaction-status"] == "applied"
    assert tool_names(script.calls(None)[-1].json()) == ["bash", "recall"]
