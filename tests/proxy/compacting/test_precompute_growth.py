"""Preparing ahead only for a conversation about to reach its trigger (#26): past the precompute
ratio, a conversation is prepared for at the last request that leaves its summary time, one
request before its trigger at its recent growth, or earlier by what its summaries take at its
pace. One that ends before that costs no summary that is never used; one that goes on finds its
summary ready; one that grows fast, or is new here, is prepared for."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from compaction import CompactionResult, HeuristicEstimator
from proxy.compacting.decision.precompute import LEAD_REQUESTS, SUMMARY_MARGIN, Precompute
from proxy.compacting.decision.request import ParsedRequest
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.http import keys
from proxy.settings import CompactionSection
from proxy.tasks import BackgroundTasks
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for

TRIGGER = int(0.85 * WINDOW)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(session: str = "s") -> ParsedRequest:
    return ParsedRequest(
        dialect=CHAT_COMPLETIONS,
        body=b"",
        payload={},
        messages=[],
        extras=None,
        model="gpt-test",
        window=WINDOW,
        max_output_tokens=None,
        session_id=session,
        opening=session,
        credential=None,
        auth_headers={},
        query="",
        tenant=b"",
        seed=b"seed",
        factor=1.0,
        estimator=HeuristicEstimator(),
    )


def precompute(clock: Clock, fit_ratio: float | None = None) -> Precompute:
    """The unit tests below measure the lead to the trigger, the last moment a compaction can
    apply with `fit_ratio` null; with room past the trigger the lead is measured to the fit
    limit instead (test_with_room_past_the_trigger_the_lead_is_measured_to_the_fit_limit)."""
    options = CompactionSection(precompute_ratio=0.7, summary_timeout_s=60, fit_ratio=fit_ratio)
    return Precompute(options, conversations=None, tasks=BackgroundTasks(), clock=clock)  # type: ignore[arg-type]


def walk(ahead: Precompute, clock: Clock, sizes: list[int], pace_s: float) -> list[bool]:
    """would_start for a conversation at `sizes`, one request every `pace_s` seconds."""
    started = []
    for size in sizes:
        clock.now += pace_s
        started.append(ahead.would_start(request(), size, size))
    return started


def finished(duration_s: float) -> asyncio.Future[object]:
    """A compaction prepared ahead that asked a model and took `duration_s`."""
    result = CompactionResult(
        messages=[],
        path="llm",
        reason="",
        keep_from=0,
        prefix_len=0,
        summary_text="",
        summary_message=None,
        memory_items=(),
        verification=None,
        tokens_before=0,
        tokens_after=0,
        fits=True,
        compaction_id="c",
        duration_s=duration_s,
    )
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


async def test_a_slow_conversation_far_from_its_trigger_is_not_prepared_for() -> None:
    clock = Clock()
    ahead = precompute(clock)
    ahead._learn(finished(2.0))  # type: ignore[arg-type]  # summaries take 2 s
    # Past the ratio by 80 tokens a request, one every 30 s: the trigger is 6 requests away.
    sizes = [2800, 2880, 2960, 3040]  # from 70% of the window
    assert walk(ahead, clock, sizes, 30.0)[1:] == [False, False, False]
    # Two requests from it, it is prepared for whatever the pace.
    assert walk(ahead, clock, [TRIGGER - LEAD_REQUESTS * 80], 30.0) == [True]


async def test_a_conversation_whose_summary_fits_a_turn_is_prepared_for_one_request_ahead() -> None:
    clock = Clock()
    ahead = precompute(clock)
    ahead._learn(finished(8.0))  # type: ignore[arg-type]  # summaries take 8 s, a turn 20 s
    # 100 tokens a request: two requests from the trigger it is not prepared for (a
    # conversation that ends there pays no summary), one request from it, it is.
    sizes = [TRIGGER - 400, TRIGGER - 300, TRIGGER - 200, TRIGGER - 100]
    assert walk(ahead, clock, sizes, 20.0)[1:] == [False, False, True]


async def test_with_room_past_the_trigger_the_lead_is_measured_to_the_fit_limit() -> None:
    """Two moments: a compaction starts at the trigger and must apply at the fit limit, so a
    conversation one request short of its trigger is not prepared for ahead; one request short
    of the fit limit it would be, and past the trigger it always is (the trigger starts it)."""
    clock = Clock()
    ahead = precompute(clock, fit_ratio=0.95)
    ahead._learn(finished(8.0))  # type: ignore[arg-type]  # summaries take 8 s, a turn 20 s
    sizes = [TRIGGER - 300, TRIGGER - 200, TRIGGER - 100]
    assert walk(ahead, clock, sizes, 20.0)[1:] == [False, False]  # null: [False, True]
    assert walk(ahead, clock, [TRIGGER], 20.0) == [True]


async def test_a_quick_conversation_is_prepared_for_a_summarys_time_ahead() -> None:
    clock = Clock()
    ahead = precompute(clock)
    ahead._learn(finished(2.0))  # type: ignore[arg-type]
    # One request a second, 80 tokens each: prepared at the last request that leaves the
    # summary SUMMARY_MARGIN x 2 s before the trigger, three requests (3 s) ahead.
    assert 2 * 1.0 < SUMMARY_MARGIN * 2.0 <= 3 * 1.0
    sizes = [TRIGGER - 480, TRIGGER - 400, TRIGGER - 320, TRIGGER - 240, TRIGGER - 160]
    assert walk(ahead, clock, sizes, 1.0)[1:] == [False, False, True, True]


async def test_until_a_summary_was_timed_a_conversation_is_prepared_for_at_the_ratio() -> None:
    clock = Clock()
    ahead = precompute(clock)  # a third of summary_timeout_s: 20 s, prepared 25 s ahead
    assert walk(ahead, clock, [2800, 2880, 2960], 3.0)[1:] == [True, True]


async def test_a_conversation_first_seen_past_the_ratio_or_edited_shorter_is_prepared_for() -> None:
    clock = Clock()
    ahead = precompute(clock)
    ahead._learn(finished(0.1))  # type: ignore[arg-type]
    assert walk(ahead, clock, [2900], 30.0) == [True]  # no pace yet
    assert walk(ahead, clock, [2950], 30.0) == [False]
    assert walk(ahead, clock, [2800], 30.0) == [True]  # shorter: not the same course


async def grow_through(client: Any, proxy: Any, ratios: list[float]) -> list[str]:
    messages: list[Any] | None = None
    statuses = []
    for ratio in ratios:
        messages = conversation_of(int(WINDOW * ratio), grow=messages)
        response = await post(client, proxy, messages)
        statuses.append(response.headers["x-compaction-status"])
    return statuses


async def test_a_fast_growing_conversation_past_the_ratio_is_prepared_for(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.7, "workers": 0})
    assert await grow_through(client, proxy, [0.55, 0.74]) == ["none", "none"]
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)


async def test_a_conversation_first_seen_past_the_ratio_is_prepared_for(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.7, "workers": 0})
    assert await grow_through(client, proxy, [0.74]) == ["none"]
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)


PACE_S = 1.0
"""Between two requests of a conversation, in the tests through the proxy: summaries are
assumed to take a third of summary_timeout_s (1.5 s) until one was timed, 0.5 s, so a request
one turn before the last that leaves SUMMARY_MARGIN of that is not prepared for."""


async def grow_at_pace(
    client: Any, proxy: Any, sizes: list[int], messages: list[Any] | None = None
) -> tuple[list[str], list[Any]]:
    statuses = []
    for size in sizes:
        messages = conversation_of(size, grow=messages)
        started = time.monotonic()
        response = await post(client, proxy, messages)
        statuses.append(response.headers["x-compaction-status"])
        await asyncio.sleep(max(0.0, PACE_S - (time.monotonic() - started)))
    assert messages is not None
    return statuses, messages


# Estimates 2528, 2778, 3028: the last past the ratio (2800), two requests of 250 tokens from
# the trigger (3400); then 3278, one request from it, and 3528, past it.
SHORT_OF_IT = [2500, 2700, 2960]
ON_TO_IT = [3200, 3420]


async def test_a_conversation_that_ends_short_of_its_trigger_pays_no_summary(
    start: Any, script: Script, client: Any
) -> None:
    assert SUMMARY_MARGIN * 1.5 / 3 < PACE_S
    proxy = await start(compaction={"precompute_ratio": 0.7, "summary_timeout_s": 1.5})
    statuses, _ = await grow_at_pace(client, proxy, SHORT_OF_IT)
    assert statuses == ["none", "none", "none"]
    await asyncio.sleep(PACE_S)  # the conversation ended: nothing was, or is, asked
    assert script.calls("summary") == [] and script.calls("memory") == []


async def test_a_conversation_that_reaches_its_trigger_finds_its_summary_ready(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.7, "summary_timeout_s": 1.5})
    statuses, messages = await grow_at_pace(client, proxy, SHORT_OF_IT)
    assert script.calls("summary") == []
    # One request from the trigger: prepared while the agent takes its turn.
    statuses, messages = await grow_at_pace(client, proxy, ON_TO_IT[:1], messages)
    await wait_for(lambda: len(script.calls("summary")) == 1, 10)
    # The record is written once the summary's answer is in, a moment after it was asked.
    await wait_for(lambda: bool(proxy.app[keys.RECORDS].get("agent-1")), 10)
    [prepared] = proxy.app[keys.RECORDS].get("agent-1")["records"]
    assert prepared["reason"] == "precompute" and prepared["waited"] is None
    statuses, _ = await grow_at_pace(client, proxy, ON_TO_IT[1:], messages)
    assert statuses == ["applied"]  # the reserve: no request waited on a summarizer
    assert [r["id"] for r in proxy.app[keys.RECORDS].get("agent-1")["records"]] == [prepared["id"]]
    assert len(script.calls("summary")) == 1
