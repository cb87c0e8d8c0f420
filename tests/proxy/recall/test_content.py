"""A recall answer always carries content (issue 34: at an 8k window, Anthropic's recall answers
were sometimes only their header line): the folded tool output holding the answer is long, the
room in the window is short, and the line that answers reaches the model, streamed or not."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.fakes.recall import RecallingModel
from tests.fakes.script import Script
from tests.proxy.compacting.test_anthropic import anthropic_body
from tests.proxy.recall.test_rounds import CANARY, archived

WINDOW = 8000
HEADERS = {
    "Content-Type": "application/json",
    "x-api-key": "sk-ant-client",
    "anthropic-version": "2023-06-01",
    "X-Session-Id": "agent-8k",
}
# A long test run whose one answering line sits among short ones: cut to that line, its
# excerpt is a few dozen characters.
OUTPUT = "\n".join(["ok"] * 1500 + [CANARY] + ["ok"] * 1500)


def with_long_output(body: dict[str, Any]) -> dict[str, Any]:
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "tool_result":
                block["content"] = OUTPUT
                return body
    raise AssertionError("no tool_result")


async def post(client: Any, url: str, body: dict[str, Any]) -> tuple[Any, bytes]:
    async with client.post(url, data=orjson.dumps(body), headers=HEADERS) as response:
        return response, await response.read()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_recall_answer_at_an_8k_window_carries_the_line_that_answers(
    start: Any, script: Script, client: Any, upstream: Any, stream: bool
) -> None:
    proxy = await start(
        upstream={"anthropic_base_url": upstream.base_url},
        models={"default_context_window": WINDOW},
    )
    body = with_long_output(anthropic_body(int(WINDOW * 1.3), max_tokens=2048))
    url = f"{proxy.url}/v1/messages"
    first, _ = await post(client, url, body)
    assert first.headers["x-compaction-status"] == "applied"
    await archived(client, proxy, "quasar QX-7781", session="agent-8k")

    model = RecallingModel("quasar QX-7781")
    script.chat = model
    response, _ = await post(client, url, {**body, "stream": stream})
    assert response.status == 200
    assert response.headers.get("x-compaction-recall-rounds") == "1" or stream
    answered = model.bodies[-1]["messages"][-1]["content"][0]
    assert answered["tool_use_id"] == "toolu_r1"
    assert CANARY in answered["content"]  # never the header alone
