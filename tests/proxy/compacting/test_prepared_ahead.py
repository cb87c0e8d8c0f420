"""Compactions prepared ahead of whichever trigger fires first, through the real proxy with a
slow summarizer: a client asking a large `max_tokens` (its prompt plus that no longer fits the
window before `trigger_ratio` is reached) never waits on the summarizer; a request that still
waits has a record saying why."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from aiohttp import web

from proxy.http import keys
from tests.fakes.script import SUMMARY_TEXT, Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for
from tests.proxy.conftest import RunningProxy

SUMMARIZER_S = 1.0
# Prompt plus this no longer fits the window from 65% of it on: before the 70% precompute ratio
# and the 80% trigger ratio.
MAX_TOKENS = int(WINDOW * 0.35)


def slow_summarizer(script: Script) -> None:
    answer = script.answer(SUMMARY_TEXT)

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(SUMMARIZER_S)
        return await answer(request)

    script.summary = slow


def records(proxy: RunningProxy, session: str) -> list[dict[str, Any]]:
    found = proxy.app[keys.RECORDS].get(session)
    return list(found["records"]) if found else []


async def test_a_large_max_tokens_is_prepared_for_before_its_trigger(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    slow_summarizer(script)
    proxy = await start(compaction={"precompute_ratio": 0.7, "summary_timeout_s": 10})
    messages = conversation_of(int(WINDOW * 0.6))
    response = await post(client, proxy, messages, max_tokens=MAX_TOKENS)
    assert response.headers["x-compaction-status"] == "none"
    # Past the precompute lead of the max_tokens rule's trigger: prepared in the background.
    await wait_for(lambda: len(records(proxy, "agent-1")) == 1, 10)
    [prepared] = records(proxy, "agent-1")
    assert prepared["reason"] == "precompute" and prepared["waited"] is None
    assert prepared["fits"] is True  # what it forwards sits well below the trigger

    # Past the max_tokens rule's trigger (not the ratio's), by less than the precompute lead.
    grown = conversation_of(int(WINDOW * 0.67), grow=messages)
    started = time.monotonic()
    response = await post(client, proxy, grown, max_tokens=MAX_TOKENS)
    assert time.monotonic() - started < SUMMARIZER_S / 2  # no summarizer call waited for
    assert response.headers["x-compaction-status"] == "applied"
    assert response.headers["x-compaction-id"] == prepared["id"]
    assert int(response.headers["x-compaction-tokens-before"]) + MAX_TOKENS > WINDOW
    assert int(response.headers["x-compaction-tokens-after"]) + MAX_TOKENS <= WINDOW


async def test_a_request_that_waits_on_a_summarizer_has_a_record_saying_why(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    slow_summarizer(script)
    proxy = await start(compaction={"precompute_ratio": 0.7, "summary_timeout_s": 10})
    # New here and past the trigger at once: nothing could have been prepared.
    response = await post(client, proxy, conversation_of(int(WINDOW * 0.9)), session="new")
    assert response.headers["x-compaction-status"] == "applied"
    [record] = records(proxy, "new")
    assert record["reason"] == "trigger"
    assert record["waited"].startswith("nothing was prepared ahead")
    assert record["fits"] is True

    off = await start(compaction={"precompute_ratio": 0, "summary_timeout_s": 10})
    response = await post(client, off, conversation_of(int(WINDOW * 0.9)), session="off")
    assert response.headers["x-compaction-status"] == "applied"
    [record] = records(off, "off")
    assert "precompute_ratio is 0" in record["waited"]
