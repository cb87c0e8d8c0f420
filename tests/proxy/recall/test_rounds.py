"""The `recall` tool end to end (whole responses): a compacted request carries it, the proxy
answers the model's calls from the session's archive and calls the upstream again, and the client
receives one ordinary response without any recall call (proxy.recall)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp import web

from compaction import SUMMARY_MARKER, recall_note
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.http import keys
from proxy.recall.tools import tool_bytes
from tests.fakes.recall import RecallingModel
from tests.fakes.script import Script
from tests.fakes.upstream import chat_completion, json_reply
from tests.proxy.compacting.conftest import WINDOW, conversation_of
from tests.proxy.compacting.conftest import post as post_chat

ADMIN = {"Authorization": "Bearer admin-secret"}
CANARY = "pytest: FAILED test_quasar_drive with code QX-7781"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


async def post(client: Any, proxy: Any, messages: list[Any], **fields: Any) -> Any:
    """An agent's request: with its own tools (a request sent without tools gets no recall)."""
    return await post_chat(client, proxy, messages, **{"tools": TOOLS, **fields})


def with_canary(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    assert messages[3]["role"] == "tool"
    messages[3] = {**messages[3], "content": CANARY}
    return messages


async def archived(client: Any, proxy: Any, query: str, session: str = "agent-1") -> None:
    """Wait until the background archive write holds `query`."""
    for _ in range(250):
        async with client.get(
            f"{proxy.url}/admin/sessions/{session}/archive", params={"q": query}, headers=ADMIN
        ) as response:
            # The turn itself (a memory item may land first, and is scoped by the archive).
            if any(item["kind"] != "memory" for item in (await response.json())["results"]):
                return
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing archived matches {query!r}")


async def compacted_and_archived(
    client: Any, proxy: Any, messages: list[dict[str, Any]], **fields: Any
) -> None:
    """A first request compacts the conversation and archives what it folded."""
    first = await post(client, proxy, messages, **fields)
    assert first.headers["x-compaction-status"] == "applied"
    await archived(client, proxy, "quasar QX-7781")


async def ask(client: Any, proxy: Any, messages: list[Any], **fields: Any) -> tuple[Any, Any]:
    body = orjson.dumps({"model": "gpt-test", "messages": messages, "tools": TOOLS, **fields})
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer sk-client",
        "X-Session-Id": "agent-1",
    }
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        return response, await response.json()


async def test_a_compacted_request_carries_the_recall_tool_after_the_clients_and_the_summary_says_so(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 1.3))
    await post(client, proxy, messages, tools=TOOLS)
    await post(client, proxy, messages, tools=TOOLS)
    first, second = (r.body for r in script.calls(None))
    # The same bytes on both requests: the client's tools, then the recall tool's fixed bytes.
    assert first == second
    sent = orjson.loads(first)
    assert sent["tools"][:1] == TOOLS and sent["tools"][1]["function"]["name"] == "recall"
    assert orjson.dumps(sent["tools"][1]) == tool_bytes(CHAT_COMPLETIONS)
    summary = next(m["content"] for m in sent["messages"] if SUMMARY_MARKER in str(m["content"]))
    assert summary.count(recall_note()[1]) == 1


async def test_a_request_without_tools_gets_no_recall_tool(
    start: Any, script: Script, client: Any
) -> None:
    # DESIGN 6d: a request the client sent without tools asks for text (Codex's handoff sends
    # `tools: []`); a tool added there is called instead of the answer being written.
    proxy = await start()
    response = await post_chat(client, proxy, conversation_of(int(WINDOW * 1.3)))
    assert response.headers["x-compaction-status"] == "applied"
    sent = script.calls(None)[0].json()
    assert "tools" not in sent
    summary = next(m["content"] for m in sent["messages"] if SUMMARY_MARKER in str(m["content"]))
    assert recall_note()[1] not in summary


async def test_recall_off_forwards_what_a_proxy_without_recall_forwards(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"recall": "off"})
    messages = conversation_of(int(WINDOW * 1.3))
    await post(client, proxy, messages, tools=TOOLS)
    sent = script.calls(None)[0].body
    assert b'"recall"' not in sent and recall_note()[1].encode() not in sent
    assert orjson.loads(sent)["tools"] == TOOLS


async def test_a_request_below_the_trigger_goes_out_byte_identical(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 0.3))
    body = orjson.dumps({"model": "gpt-test", "messages": messages, "tools": TOOLS})
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "X-Session-Id": "agent-1"},
    ) as response:
        await response.read()
    assert script.calls(None)[0].body == body


async def test_a_client_with_its_own_recall_tool_gets_neither_ours_nor_interception(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    own = [{"type": "function", "function": {"name": "recall", "parameters": {"type": "object"}}}]
    model = RecallingModel("quasar")
    script.chat = model
    response, answer = await ask(client, proxy, conversation_of(int(WINDOW * 1.3)), tools=own)
    assert response.headers["x-compaction-status"] == "applied"
    assert orjson.loads(script.calls(None)[0].body)["tools"] == own
    # The client's own tool: its call reaches the client.
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "recall"
    assert len(script.calls(None)) == 1


async def test_the_model_recalls_a_folded_tool_output_and_the_client_sees_one_plain_answer(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages, tools=TOOLS)
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    response, answer = await ask(client, proxy, messages, tools=TOOLS)

    assert response.status == 200
    message = answer["choices"][0]["message"]
    assert "tool_calls" not in message and answer["choices"][0]["finish_reason"] == "stop"
    assert CANARY in message["content"] and "turn 3, tool output" in message["content"]
    assert model.problems == []
    assert len(model.bodies) == 2
    # The second call is the first plus the call and its answer.
    first, second = model.bodies
    assert second["messages"][: len(first["messages"])] == first["messages"]
    added = second["messages"][len(first["messages"]) :]
    assert added[0]["tool_calls"][0]["id"] == "call_r1" and added[1]["tool_call_id"] == "call_r1"
    assert second["tools"] == first["tools"]
    # One round; usage is both calls' sum; the id is the first response's.
    assert response.headers["x-compaction-recall-rounds"] == "1"
    assert response.headers["x-compaction-recall-tokens"] == "105"
    assert float(response.headers["x-compaction-recall-ms"]) >= 0
    # The rewritten body goes out whole, with its length (not chunked).
    assert "Transfer-Encoding" not in response.headers
    assert response.content_length == len(orjson.dumps(answer))
    assert answer["usage"] == {"prompt_tokens": 200, "completion_tokens": 10, "total_tokens": 210}
    async with client.get(f"{proxy.url}/metrics") as metrics:
        text = (await metrics.read()).decode()
    assert 'compaction_proxy_recall_rounds_total{dialect="chat"} 1.0' in text
    assert "compaction_proxy_recall_round_seconds_count 1.0" in text
    timeline = proxy.app[keys.RECORDS].timeline("agent-1")
    assert timeline[-1]["recall_rounds"] == 1 and timeline[-1]["recall_tokens"] == 105


async def test_rounds_stop_at_recall_max_rounds_and_the_client_never_sees_the_call(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"recall_max_rounds": 2})
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages)
    model = RecallingModel("quasar", calls=10)
    script.chat = model
    response, answer = await ask(client, proxy, messages)
    assert len(model.bodies) == 3 and model.problems == []
    assert response.headers["x-compaction-recall-rounds"] == "2"
    choice = answer["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"


async def test_a_recall_call_beside_the_clients_own_returns_the_clients_call_only(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages, tools=TOOLS)
    model = RecallingModel("quasar", also=("bash", '{"cmd": "ls"}'))
    script.chat = model
    response, answer = await ask(client, proxy, messages, tools=TOOLS)
    assert len(model.bodies) == 1 and response.headers["x-compaction-recall-rounds"] == "0"
    choice = answer["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["bash"]
    assert choice["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("failure", ["status", "garbage"])
async def test_a_failing_round_gives_the_client_the_first_response_without_the_recall_call(
    start: Any, script: Script, client: Any, failure: str
) -> None:
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages)
    model = RecallingModel("quasar")
    broken = (
        json_reply({"error": {"message": "overloaded"}}, status=529)
        if failure == "status"
        else None
    )

    async def reply(request: web.Request) -> web.StreamResponse:
        if len(model.bodies) == 0:
            return await model(request)
        await request.read()
        model.bodies.append({})
        if broken is not None:
            return await broken(request, script.upstream)
        return web.Response(body=b"not json", content_type="application/json")

    script.chat = reply
    response, answer = await ask(client, proxy, messages)
    assert response.status == 200
    choice = answer["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    assert response.headers["x-compaction-recall-rounds"] == "0"
    async with client.get(f"{proxy.url}/metrics") as metrics:
        text = (await metrics.read()).decode()
    reason = "upstream_error" if failure == "status" else "unreadable"
    assert f'compaction_proxy_recall_given_up_total{{reason="{reason}"}} 1.0' in text


async def test_nothing_of_another_credential_or_session_is_recalled(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages)
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    # Their own conversations (without the canary) compact too: only theirs can be recalled.
    others = conversation_of(int(WINDOW * 1.3))
    for fields in ({"auth": "Bearer sk-someone-else"}, {"session": "agent-2"}):
        response = await post(client, proxy, others, **fields)
        assert response.headers["x-compaction-status"] == "applied"
        result = model.bodies[-1]["messages"][-1]["content"]
        assert CANARY not in result and "Nothing earlier matches" in result


async def test_the_recall_tool_is_counted_so_the_upstreams_usage_keeps_the_estimates_true(
    start: Any, script: Script, client: Any
) -> None:
    # The scripted upstream reports the tokens of what it was sent, the recall tool included;
    # were the tool not counted, the calibration would read an under-count and inflate the next
    # estimate of the same conversation.
    proxy = await start()
    messages = conversation_of(int(WINDOW * 1.3))
    first = await post(client, proxy, messages, session="s1")
    second = await post(client, proxy, messages, session="s2")
    assert b'"recall"' in script.calls(None)[0].body
    before = [int(r.headers["x-compaction-tokens-before"]) for r in (first, second)]
    assert abs(before[1] - before[0]) <= before[0] * 0.02


async def test_an_upstream_refusing_the_tool_gets_the_request_once_more_without_it(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()

    async def no_recall(request: web.Request) -> web.StreamResponse:
        if b'"recall"' in await request.read():
            error = {"message": "tool recall is not supported here", "type": "invalid"}
            return web.json_response({"error": error}, status=400)
        return web.json_response(chat_completion("fine"))

    script.chat = no_recall
    response = await post(client, proxy, conversation_of(int(WINDOW * 1.3)))
    assert response.status == 200
    first, retried = (r.json() for r in script.calls(None))
    assert first["tools"][-1]["function"]["name"] == "recall" and retried["tools"] == TOOLS
    assert recall_note()[1] not in str(retried)


class DownArchive:
    """An archive whose backend is down: every call fails."""

    name = "down"

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def add(self, scope: Any, entries: Any) -> dict[str, int]:
        raise ConnectionError("archive down")

    async def search(self, session: str, query: str, *, tenant: Any, limit: int) -> Any:
        raise ConnectionError("archive down")

    async def compactions(self, session: str, *, tenant: Any) -> set[str]:
        raise ConnectionError("archive down")


async def test_an_archive_that_is_down_tells_the_model_and_the_client_gets_its_answer(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start({"archive_backend": DownArchive()})
    model = RecallingModel("quasar")
    script.chat = model
    response, answer = await ask(client, proxy, conversation_of(int(WINDOW * 1.3)))
    assert response.status == 200 and response.headers["x-compaction-recall-rounds"] == "1"
    assert "recall is unavailable" in answer["choices"][0]["message"]["content"]


async def test_a_request_just_below_the_trigger_still_gets_room_for_the_recalled_turn(
    start: Any, script: Script, client: Any
) -> None:
    # Compacted requests go out as they are up to the trigger (0.85 of the window): the fill
    # ratio less the output's reserve then left a recall result no room, and the model got an
    # empty recall back. (The growth below reaches just under the trigger from this target,
    # with the scripted model's memory items, asked standalone at this small window's end.)
    proxy = await start(compaction={"target_ratio": 0.6, "summary_request": "standalone"})
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages, tools=TOOLS)
    model = RecallingModel("quasar QX-7781")
    script.chat = model
    grown = conversation_of(int(WINDOW * 1.45), grow=messages)
    response, answer = await ask(client, proxy, grown, tools=TOOLS)

    assert response.headers["x-compaction-status"] == "reused"
    # With the recall tool and its line (about 270 tokens at this window, counted where the
    # trigger is checked), this is just under the trigger.
    assert int(response.headers["x-compaction-tokens-after"]) > 0.74 * WINDOW
    assert response.headers["x-compaction-recall-rounds"] == "1"
    assert CANARY in answer["choices"][0]["message"]["content"]
    assert model.problems == []
