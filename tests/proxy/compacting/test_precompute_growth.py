"""Preparing ahead only for a conversation on course to reach its trigger soon (#26): past the
precompute ratio, a conversation whose recent growth and pace leave the trigger further than
a few requests and a few summaries' time away costs no summary that may never be used; one
that grows fast, or is new here, is prepared for."""

from __future__ import annotations

import asyncio
from typing import Any

from compaction import CompactionResult, HeuristicEstimator
from proxy.compacting.dialects.chat import CHAT_COMPLETIONS
from proxy.compacting.precompute import LEAD_REQUESTS, SUMMARY_MARGIN, Precompute
from proxy.compacting.request import ParsedRequest
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


def precompute(clock: Clock) -> Precompute:
    options = CompactionSection(precompute_ratio=0.7, summary_timeout_s=60)
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


async def test_a_quick_conversation_is_prepared_for_a_summarys_time_ahead() -> None:
    clock = Clock()
    ahead = precompute(clock)
    ahead._learn(finished(2.0))  # type: ignore[arg-type]
    # One request a second: six requests from the trigger is within 3 x 2 s, seven is not.
    assert 6 * 1.0 <= SUMMARY_MARGIN * 2.0 < 7 * 1.0
    assert walk(ahead, clock, [2800, 2880, 2960, 3040], 1.0)[1:] == [False, True, True]


async def test_until_a_summary_was_timed_a_conversation_is_prepared_for_at_the_ratio() -> None:
    clock = Clock()
    ahead = precompute(clock)  # a third of summary_timeout_s: 20 s, prepared 60 s ahead
    assert walk(ahead, clock, [2800, 2880, 2960], 5.0)[1:] == [True, True]


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
