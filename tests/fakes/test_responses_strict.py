"""The strict Responses fake refuses what the API refuses, and only that: the e2e runs' "nothing
refused" means something only while each refusal is really made (tests/fakes/
responses_strict.py cites the pages)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.fakes.responses_strict import REASONING, StrictResponses, call


def reason_then_call(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [REASONING, call("exec_command", {"cmd": "ls"})]


@pytest.fixture
async def api() -> AsyncIterator[StrictResponses]:
    async with StrictResponses(reason_then_call, window=2_000) as fake:
        yield fake


async def post(api: StrictResponses, items: list[Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        body = {"model": "m", "input": items}
        async with http.post(f"{api.base_url}/responses", json=body) as response:
            return response.status, await response.json()


PROMPT = {"type": "message", "role": "user", "content": "list the files"}


async def first_turn(api: StrictResponses) -> list[Any]:
    """The history after one step: the prompt, the model's output, the call's output."""
    status, answer = await post(api, [PROMPT])
    assert status == 200
    output = answer["output"]
    done = {"type": "function_call_output", "call_id": output[1]["call_id"], "output": "a b"}
    return [PROMPT, *output, done]


async def test_a_history_as_issued_is_accepted(api: StrictResponses) -> None:
    history = await first_turn(api)
    assert (await post(api, history))[0] == 200
    status, answer = await post(api, [*history, {"type": "compaction_trigger"}])
    (item,) = answer["output"]
    assert status == 200 and item["type"] == "compaction"
    assert (await post(api, [PROMPT, item]))[0] == 200
    assert api.refused == []


async def test_reasoning_without_its_following_item_is_refused(api: StrictResponses) -> None:
    history = await first_turn(api)
    reasoning = history[1]
    status, answer = await post(api, [PROMPT, reasoning, PROMPT])
    assert status == 400
    assert answer["error"]["message"].endswith(
        f"Item '{reasoning['id']}' of type 'reasoning' was provided without its required "
        "following item."
    )
    # Followed by a call, but not the one it led to: refused too.
    other = {**history[2], "call_id": "call_other"}
    output = {**history[3], "call_id": "call_other"}
    status, _ = await post(api, [PROMPT, reasoning, other, output])
    assert status == 400


async def test_made_up_or_altered_opaque_items_are_refused(api: StrictResponses) -> None:
    history = await first_turn(api)
    forged = {**history[1], "encrypted_content": "gAAAAmade-up"}
    assert (await post(api, [PROMPT, forged, *history[2:]]))[0] == 400
    await post(api, [*history, {"type": "compaction_trigger"}])
    ((issued_id, content),) = api.compactions.items()
    unknown = {"type": "compaction", "encrypted_content": "gAAAAmade-up"}
    altered = {"type": "compaction", "id": issued_id, "encrypted_content": content[:-1]}
    assert (await post(api, [PROMPT, unknown]))[0] == 400
    assert (await post(api, [PROMPT, altered]))[0] == 400
    assert len(api.refused) == 3


async def test_unpaired_calls_and_prompts_past_the_window_are_refused(
    api: StrictResponses,
) -> None:
    history = await first_turn(api)
    assert (await post(api, history[:3]))[0] == 400  # the call has no output
    assert (await post(api, [PROMPT, history[3]]))[0] == 400  # an output with no call
    long = {"type": "message", "role": "user", "content": "word " * 4_000}
    status, answer = await post(api, [long])
    assert status == 400 and "context window" in answer["error"]["message"]


async def test_a_get_on_responses_is_refused(api: StrictResponses) -> None:
    """A WebSocket handshake with its Upgrade and Connection headers dropped on the way (a
    half handshake) is no handshake: the fake answers 400, as Codex then exits."""
    headers = {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{api.base_url}/responses", headers=headers) as response,
    ):
        assert response.status == 400
    assert "half handshake" in api.refused[0].message
