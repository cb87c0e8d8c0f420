"""Two moments (compaction.fit_ratio): the trigger is where a compaction starts, the fit limit
where it must apply. Through the real proxy with a summarizer held back: past the trigger, a
request that still fits goes upstream as the client sent it while its compaction runs; the
compaction applies on the first request after it is ready; only a request that would no longer
fit waits for it; a conversation that stops short of the trigger never pays for a summary."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from proxy.http import keys
from tests.fakes.script import SUMMARY_TEXT, Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for
from tests.proxy.conftest import RunningProxy

TWO_MOMENTS = {"fit_ratio": 0.95, "precompute_ratio": 0, "summary_timeout_s": 10}


def held_summarizer(script: Script) -> asyncio.Event:
    """The summarizer answers only once the returned event is set."""
    release = asyncio.Event()
    answer = script.answer(SUMMARY_TEXT)

    async def held(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return await answer(request)

    script.summary = held
    return release


def records(proxy: RunningProxy, session: str) -> list[dict[str, Any]]:
    found = proxy.app[keys.RECORDS].get(session)
    return list(found["records"]) if found else []


async def test_past_the_trigger_a_request_that_fits_goes_as_sent_and_its_compaction_applies_when_ready(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    release = held_summarizer(script)
    proxy = await start(compaction=TWO_MOMENTS)
    crossed = conversation_of(int(WINDOW * 0.87))
    response = await post(client, proxy, crossed)
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "none"
    assert int(response.headers["x-compaction-tokens-before"]) >= WINDOW * 0.85
    assert script.calls(None)[-1].json()["messages"] == crossed  # as the client sent it
    # Its compaction started in the background: the summarizer was asked once.
    await wait_for(lambda: len(script.calls("summary")) == 1)

    # Still running, and the next request still fits: it goes as sent too, without waiting.
    grown = conversation_of(int(WINDOW * 0.9), grow=crossed)
    response = await post(client, proxy, grown)
    assert response.headers["x-compaction-status"] == "none"
    assert script.calls(None)[-1].json()["messages"] == grown
    assert len(script.calls("summary")) == 1  # one compaction per growth step

    release.set()
    await wait_for(lambda: len(records(proxy, "agent-1")) == 1, 10)
    more = conversation_of(int(WINDOW * 0.92), grow=grown)
    response = await post(client, proxy, more)
    assert response.headers["x-compaction-status"] == "applied"
    assert int(response.headers["x-compaction-tokens-after"]) < WINDOW * 0.85
    [record] = records(proxy, "agent-1")
    assert record["waited"] is None  # no request waited for it
    assert response.headers["x-compaction-id"] == record["id"]
    assert len(script.calls("summary")) == 1


async def test_a_request_that_would_no_longer_fit_waits_for_its_compaction(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    release = held_summarizer(script)
    proxy = await start(compaction=TWO_MOMENTS)
    crossed = conversation_of(int(WINDOW * 0.87))
    assert (await post(client, proxy, crossed)).headers["x-compaction-status"] == "none"
    await wait_for(lambda: len(script.calls("summary")) == 1)

    past_fit = conversation_of(int(WINDOW * 0.97), grow=crossed)
    waiting = asyncio.ensure_future(post(client, proxy, past_fit))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # held until the compaction it needs is ready
    release.set()
    response = await waiting
    assert response.headers["x-compaction-status"] == "applied"
    assert int(response.headers["x-compaction-tokens-after"]) < WINDOW * 0.85


async def test_a_max_tokens_that_no_longer_fits_leaves_no_room_past_the_trigger(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    """A prompt plus its `max_tokens` over the window never goes as sent: the fit limit is the
    window less `max_tokens`, however high `fit_ratio` is."""
    proxy = await start(compaction=TWO_MOMENTS)
    messages = conversation_of(int(WINDOW * 0.8))
    response = await post(client, proxy, messages, max_tokens=int(WINDOW * 0.25))
    assert response.headers["x-compaction-status"] == "applied"


async def test_a_conversation_that_stops_short_of_the_trigger_pays_no_summary(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    """Past the precompute ratio, growing a little a request, with room to the fit limit: it is
    not prepared for ahead, so a conversation that ends before its trigger costs no summarizer
    call. (Prepared for the trigger instead, as with `fit_ratio` null, the last requests here
    leave a summary too little time at this pace, and one is started.)"""
    # A summary's time is guessed at a third of the timeout until one ran: 0.1 s here.
    proxy = await start(
        compaction={**TWO_MOMENTS, "precompute_ratio": 0.7, "summary_timeout_s": 0.3, "workers": 0}
    )
    messages = conversation_of(int(WINDOW * 0.6))
    for share in (0.66, 0.7, 0.72, 0.74, 0.76, 0.78, 0.8):
        messages = conversation_of(int(WINDOW * share), grow=messages)
        assert (await post(client, proxy, messages)).headers["x-compaction-status"] == "none"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # planning runs in the proxy (`workers` 0): a call would be made
    assert script.calls("summary") == []
    assert records(proxy, "agent-1") == []


async def test_fit_ratio_null_compacts_the_request_at_the_trigger(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    proxy = await start(compaction={**TWO_MOMENTS, "fit_ratio": None})
    response = await post(client, proxy, conversation_of(int(WINDOW * 0.87)))
    assert response.headers["x-compaction-status"] == "applied"
