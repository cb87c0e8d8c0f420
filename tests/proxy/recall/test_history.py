"""What a recall round leaves the client: a history the API accepts on its next request. In the
Responses API a reasoning item goes back only with the item that followed it ("... was provided
without its required following item"): the reasoning that led to a withheld recall call is
withheld with it, streamed or not. (Anthropic's thinking after a hidden round:
tests/proxy/compacting/test_preserved_thinking.py, against the strict fake.)"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.dialects.responses.recall import without_tool_calls
from tests.fakes.recall import RecallingModel
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW
from tests.proxy.compacting.test_responses import responses_body
from tests.proxy.compacting.test_responses import send as send_responses
from tests.proxy.recall.test_rounds import archived
from tests.proxy.recall.test_sdks import canary_in_responses


def reasoning_without_its_item(items: list[Any]) -> list[int]:
    """The places of reasoning items not followed by an item of another kind."""
    return [
        i
        for i, item in enumerate(items)
        if item.get("type") == "reasoning"
        and (i + 1 == len(items) or items[i + 1].get("type") == "reasoning")
    ]


def streamed_output(raw: bytes) -> list[Any]:
    """The items a client keeps from a streamed response: each `output_item.done`, in order."""
    items: dict[int, Any] = {}
    for chunk in raw.split(b"\n\n"):
        data = [line[6:] for line in chunk.split(b"\n") if line.startswith(b"data: ")]
        if data:
            event = orjson.loads(data[0])
            if event["type"] == "response.output_item.done":
                items[event["output_index"]] = event["item"]
    return [items[i] for i in sorted(items)]


@pytest.mark.parametrize("stream", [False, True])
async def test_no_reasoning_item_is_left_without_its_following_item_after_a_round(
    start: Any, script: Script, client: Any, stream: bool
) -> None:
    proxy = await start()
    body = canary_in_responses(responses_body(int(WINDOW * 1.3)))
    url = f"{proxy.url}/s/agent-r/v1/responses"
    first = await send_responses(client, url, body)
    assert first.headers["x-compaction-status"] == "applied"
    await archived(client, proxy, "quasar QX-7781", session="agent-r")
    model = RecallingModel("quasar QX-7781", reasoning=True)
    script.chat = model
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-client"}
    async with client.post(
        url, data=orjson.dumps({**body, "stream": stream}), headers=headers
    ) as response:
        assert response.status == 200
        raw = await response.read()
    assert len(model.bodies) == 2  # the round happened
    output = streamed_output(raw) if stream else orjson.loads(raw)["output"]
    assert any(item["type"] == "reasoning" for item in output)
    kept = [*body["input"], *output]  # what the client sends back next
    assert reasoning_without_its_item(kept) == []
    if stream:
        ended = next(c for c in raw.split(b"\n\n") if b'"response.completed"' in c)
        completed = orjson.loads(ended.split(b"data: ", 1)[1])["response"]["output"]
        assert [i["type"] for i in completed] == [i["type"] for i in output]


def test_a_reasoning_item_goes_with_the_recall_call_it_led_to() -> None:
    output = [
        {"type": "reasoning", "id": "rs_1"},
        {"type": "function_call", "name": "recall", "id": "fc_1"},
        {"type": "reasoning", "id": "rs_2"},
        {"type": "function_call", "name": "bash", "id": "fc_2"},
    ]
    assert [item["id"] for item in without_tool_calls(output, "recall")] == ["rs_2", "fc_2"]
