"""Recall offered only where every call to it can be answered, and bounded: no `recall` tool for
a chat request asking for several choices (`n > 1`: the rounds answer one), none beside a client's
own `recall` declared in the legacy `functions`, and a long query clipped in what is searched and
what is echoed back."""

from __future__ import annotations

from typing import Any

import orjson

from tests.fakes.recall import RecallingModel, results
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.recall.test_rounds import TOOLS, ask, compacted_and_archived, with_canary


async def test_a_request_for_several_choices_goes_out_without_the_recall_tool(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 1.3))
    # The agent's own tools: a request sent without tools never gets recall anyway.
    response = await post(client, proxy, messages, n=2, tools=TOOLS)
    assert response.headers["x-compaction-status"] == "applied"
    sent = orjson.loads(script.calls(None)[0].body)
    assert sent["n"] == 2 and sent["tools"] == TOOLS
    # One choice (n: 1, or no n at all) still gets it.
    await post(client, proxy, messages, n=1, tools=TOOLS)
    sent = orjson.loads(script.calls(None)[1].body)
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["bash", "recall"]


async def test_a_recall_declared_in_legacy_functions_is_the_clients_own(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    own = [{"name": "recall", "parameters": {"type": "object"}}]
    messages = conversation_of(int(WINDOW * 1.3))
    response = await post(client, proxy, messages, functions=own, tools=TOOLS)
    assert response.headers["x-compaction-status"] == "applied"
    sent = orjson.loads(script.calls(None)[0].body)
    assert sent["functions"] == own and sent["tools"] == TOOLS  # no second `recall`


async def test_a_long_recall_query_is_clipped_in_the_search_and_in_the_result(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = with_canary(conversation_of(int(WINDOW * 1.3)))
    await compacted_and_archived(client, proxy, messages)
    # 1.2 MB of query: its first words are what the model looks for.
    model = RecallingModel("quasar QX-7781 " + "filler " * 170_000)
    script.chat = model
    response, _ = await ask(client, proxy, messages)
    assert response.status == 200 and model.problems == []
    [result] = results("/v1/chat/completions", model.bodies[-1])
    assert "QX-7781" in result  # the clipped query still finds the folded turn
    assert "filler " * 100 not in result and len(result) < 40_000
