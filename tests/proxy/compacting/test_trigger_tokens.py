"""An absolute trigger (`compaction.trigger_tokens`) on a 1M-token window, end to end: a
conversation grown to 400k compacts at 200k, not at the ratio's 850k, and what the compaction
aims at and when it is prepared follow that trigger (compaction.Trigger)."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from tests import factories as f
from tests.fakes.script import Script, tokens
from tests.proxy.compacting.conftest import wait_for
from tests.proxy.conftest import RunningProxy

MILLION = 1_000_000
TRIGGER = 200_000
ROUND_TOKENS = 10_000
"""What each added round costs, about: one tool block with a 40k-character output. A few big
messages make a 400k-token conversation in microseconds; the summarizer is the scripted fake."""

SECTIONS: dict[str, Any] = {
    "models": {"context_windows": {"gpt-test": MILLION}},
    "compaction": {"trigger_tokens": TRIGGER},
}


def grow(messages: list[dict[str, Any]], to: int) -> tuple[list[dict[str, Any]], int]:
    """`messages` (its last user message dropped) continued by rounds to about `to` tokens,
    ending in a user message; and its estimate."""
    grown = messages[:-1] if len(messages) > 1 else messages[:]
    total = tokens(grown)
    i = len(grown)
    while total < to:
        added = f.tool_round(i, blocks=1, output_chars=4 * ROUND_TOKENS)
        grown += added
        total += tokens(added) - tokens([])
        i += 1
    grown.append(f.user(f"Now summarize round {i} for me."))
    return grown, tokens(grown)


async def post(
    client: aiohttp.ClientSession, proxy: RunningProxy, messages: list[dict[str, Any]]
) -> aiohttp.ClientResponse:
    """The conftest's post, for bodies of megabytes (aiohttp warns on raw bytes past 1 MiB)."""
    body = io.BytesIO(orjson.dumps({"model": "gpt-test", "messages": messages}))
    headers = {
        "Content-Type": "application/json",
        "Authorization": "Bearer sk-client",
        "X-Session-Id": "agent-1",
    }
    async with client.post(
        f"{proxy.url}/v1/chat/completions", data=body, headers=headers
    ) as response:
        await response.read()
        return response


async def test_a_conversation_grown_to_400k_on_a_1m_window_compacts_at_200k(
    start: Callable[..., Awaitable[RunningProxy]], script: Script, client: Any
) -> None:
    proxy = await start(**SECTIONS)
    messages: list[dict[str, Any]] = [f.system(), f.user("Fix the failing tests.")]
    total, compacted_at = 0, None
    # Steps of about 30k land clear of the trigger on either side (170k, 200k+).
    for size in [*range(50_000, 400_000, 30_000), 400_000]:
        messages, total = grow(messages, size)
        sent = len(script.calls(None))
        response = await post(client, proxy, messages)
        assert response.status == 200
        out = script.calls(None)[sent]
        status = response.headers["x-compaction-status"]
        if compacted_at is None and total < TRIGGER:
            # Under the trigger: the client's bytes, untouched.
            assert status == "none", (total, status)
            assert out.body == orjson.dumps({"model": "gpt-test", "messages": messages})
            continue
        if compacted_at is None:
            assert status == "applied", (total, status)
            compacted_at = total
            # Aimed at the target of the absolute trigger (0.35 of 235k: 82k), not of the
            # window (350k, above the trigger itself).
            assert tokens(out.json()["messages"]) < 0.6 * TRIGGER
        # From the first compaction on, what goes upstream sits below the trigger.
        assert status in ("applied", "reused"), (total, status)
        assert tokens(out.json()["messages"]) < TRIGGER, total
        assert int(response.headers["x-compaction-tokens-after"]) < TRIGGER
    assert compacted_at is not None and TRIGGER <= compacted_at < TRIGGER + 3 * ROUND_TOKENS
    assert total >= 400_000


async def test_preparing_ahead_follows_the_absolute_trigger_not_the_window(
    start: Callable[..., Awaitable[RunningProxy]], script: Script, client: Any
) -> None:
    # precompute_ratio 0.7 of the window whose 0.85 is 200k: ~165k (as far before 200k as 0.7
    # is before 0.85 of that window; of the 1M window it would be 50k). At 100k nothing is
    # prepared; at 180k the next compaction is, in the background (a summary: its call shows
    # it); both requests go as sent.
    compaction = {**SECTIONS["compaction"], "precompute_ratio": 0.7, "strategy": "summary"}
    proxy = await start(**{**SECTIONS, "compaction": compaction})
    early, total = grow([f.system(), f.user("Fix the failing tests.")], 100_000)
    assert total < 165_000
    later, total = grow(early, 180_000)
    assert 165_000 < total < TRIGGER
    for messages in (early, later):
        response = await post(client, proxy, messages)
        assert response.headers["x-compaction-status"] == "none"
        assert script.calls(None)[-1].body == orjson.dumps(
            {"model": "gpt-test", "messages": messages}
        )
    await wait_for(lambda: bool(script.calls("summary")), timeout_s=30)
    # Asked over the conversation at 180k (the cached summary request repeats it), never at 100k.
    latest = orjson.dumps(later[-1])
    assert all(latest in call.body for call in script.calls("summary"))
