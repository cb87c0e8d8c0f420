"""The archive is per conversation: a session id reused by a new conversation (one
`base_url=.../s/my-agent/v1` for every run of an agent) archives the new conversation's own turns,
and its recall never returns the other's
(proxy.compacting.decision.request.ParsedRequest.conversation)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from tests.fakes.recall import RecallingModel, results
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of
from tests.proxy.recall.test_rounds import TOOLS

ADMIN = {"Authorization": "Bearer admin-secret"}
FIRST = "pytest: FAILED test_quasar_drive with code QX-7781"
SECOND = "pytest: FAILED test_nebula_pump with code NB-3319"


def conversation(task: str, canary: str) -> list[dict[str, Any]]:
    """A conversation past the trigger whose first request is `task` and whose first tool output
    (folded by its compaction) is `canary`."""
    messages = conversation_of(int(WINDOW * 1.3))
    assert messages[1]["role"] == "user" and messages[3]["role"] == "tool"
    messages[1] = {**messages[1], "content": task}
    messages[3] = {**messages[3], "content": canary}
    return messages


async def send(client: Any, proxy: Any, messages: list[dict[str, Any]]) -> Any:
    # The agent's own tools: a request sent without tools is never offered recall.
    body = orjson.dumps({"model": "gpt-test", "messages": messages, "tools": TOOLS})
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-client"}
    url = f"{proxy.url}/s/my-agent/v1/chat/completions"
    async with client.post(url, data=body, headers=headers) as response:
        await response.read()
        return response


async def archived(client: Any, proxy: Any, query: str) -> None:
    """Wait until the session's archive (every conversation's, as an operator sees it) holds a
    turn matching `query`."""
    url = f"{proxy.url}/admin/sessions/my-agent/archive"
    for _ in range(250):
        async with client.get(url, params={"q": query}, headers=ADMIN) as response:
            found = (await response.json())["results"]
        if any(item["kind"] != "memory" and query.split()[-1] in item["text"] for item in found):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing archived matches {query!r}")


async def test_a_new_conversation_under_a_reused_session_id_archives_and_recalls_its_own_turns(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    first = conversation("Task 0: fix the quasar drive", FIRST)
    second = conversation("Task 0: fix the nebula pump", SECOND)
    for messages, query in ((first, "quasar QX-7781"), (second, "nebula NB-3319")):
        response = await send(client, proxy, messages)
        assert response.headers["x-compaction-status"] == "applied"
        await archived(client, proxy, query)

    for query, own, other in (("nebula NB-3319", SECOND, FIRST), ("quasar QX-7781", None, FIRST)):
        model = RecallingModel(query)
        script.chat = model
        response = await send(client, proxy, second)
        assert response.status == 200 and model.problems == []
        [result] = results("/v1/chat/completions", model.bodies[-1])
        assert other not in result, query
        if own is not None:
            assert own in result and "turn 3, tool output" in result

    # The first conversation still recalls its own, and only its own.
    model = RecallingModel("quasar QX-7781 nebula NB-3319")
    script.chat = model
    await send(client, proxy, first)
    [result] = results("/v1/chat/completions", model.bodies[-1])
    assert FIRST in result and SECOND not in result
