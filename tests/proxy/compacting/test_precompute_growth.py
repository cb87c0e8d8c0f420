"""Preparing ahead only for a conversation on course to reach its trigger (#26): past the
precompute ratio, a conversation whose recent growth, LEAD_REQUESTS times over, stays short of
the trigger costs no summary that may never be used; one that grows fast is prepared for."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.compacting.precompute import LEAD_REQUESTS
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for


async def grow_through(client: Any, proxy: Any, ratios: list[float]) -> list[str]:
    messages: list[Any] | None = None
    statuses = []
    for ratio in ratios:
        messages = conversation_of(int(WINDOW * ratio), grow=messages)
        response = await post(client, proxy, messages)
        statuses.append(response.headers["x-compaction-status"])
    return statuses


async def test_a_slowly_growing_conversation_past_the_ratio_is_not_prepared_for(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.7, "workers": 0})
    # Steps of about 2% of the window: from 71%, two more stay well below the 85% trigger.
    statuses = await grow_through(client, proxy, [0.66, 0.68, 0.70, 0.72])
    assert statuses == ["none"] * 4
    assert 0.72 + LEAD_REQUESTS * 0.03 < 0.85
    await asyncio.sleep(0.5)
    assert script.calls("summary") == [] and script.calls("memory") == []


async def test_a_fast_growing_conversation_past_the_ratio_is_prepared_for(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.7, "workers": 0})
    assert await grow_through(client, proxy, [0.55, 0.72]) == ["none", "none"]
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)


async def test_a_conversation_first_seen_past_the_ratio_is_prepared_for(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.7, "workers": 0})
    assert await grow_through(client, proxy, [0.74]) == ["none"]
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)
