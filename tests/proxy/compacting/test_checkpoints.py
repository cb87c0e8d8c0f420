"""Checkpoints through the real proxy: reuse, single-flight, precompute, summaries that outlive their request."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.admin.records import SessionRecords
from proxy.http import keys
from tests import factories as f
from tests.fakes.offload import SlowFirstPlan
from tests.fakes.script import SUMMARY_TEXT, Script, tokens
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import (
    WINDOW,
    conversation_of,
    forwarded,
    post,
    wait_for,
    with_hook,
)
from tests.proxy.conftest import RunningProxy, StartProxy


async def test_follow_up_requests_reuse_the_checkpoint_with_a_byte_identical_prefix(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    messages = conversation_of(int(WINDOW * 1.1))
    await post(client, proxy, messages)
    messages = [*messages, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    second = await post(client, proxy, messages)
    assert second.headers["x-compaction-status"] == "reused"
    assert len(script.calls("summary")) == 1
    first_out, second_out = (sent["messages"] for sent in forwarded(script))
    assert orjson.dumps(first_out[:2]) == orjson.dumps(second_out[:2])
    assert second_out[-2:] == messages[-2:]


async def test_concurrent_identical_requests_share_one_summarization(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    hold_summary_until(script, proxy, in_flight=10)
    messages = conversation_of(int(WINDOW * 1.2))
    responses = await asyncio.gather(*(post(client, proxy, messages) for _ in range(10)))
    assert [r.status for r in responses] == [200] * 10
    assert len(script.calls("summary")) == 1
    bodies = {orjson.dumps(sent["messages"]) for sent in forwarded(script)}
    assert len(bodies) == 1


async def test_concurrent_requests_sharing_one_summarization_report_it_applied_once(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    hold_summary_until(script, proxy, in_flight=4)
    messages = conversation_of(int(WINDOW * 1.2))
    responses = await asyncio.gather(*(post(client, proxy, messages) for _ in range(4)))
    assert len(script.calls("summary")) == 1
    # One compaction, new to the conversation once: "applied" counts compactions.
    statuses = sorted(r.headers["x-compaction-status"] for r in responses)
    assert statuses == ["applied", "reused", "reused", "reused"]
    labels = {"status": "applied", "dialect": "chat"}
    registry = proxy.app[keys.METRICS].registry
    assert registry.get_sample_value("compaction_proxy_chat_decisions_total", labels) == 1


async def test_concurrent_requests_differing_after_the_fold_each_keep_their_own_turns(
    start: Any, script: Script, client: Any
) -> None:
    # At this target the three requests cut at the same block (at a lower one the grown
    # request's kept part would start a block later: another fold, another summary).
    proxy = await start(compaction={"target_ratio": 0.6})
    hold_summary_until(script, proxy, in_flight=3)
    messages = conversation_of(int(WINDOW * 1.2))
    # One prefix to fold, three different latest turns: as sent, edited, grown.
    edited = [*messages[:-1], f.user("No, rename the module instead.")]
    grown = [*messages, f.assistant("Here it is."), f.user("Now run the tests.")]
    sent = (messages, edited, grown)
    responses = await asyncio.gather(*(post(client, proxy, m) for m in sent))
    assert [r.status for r in responses] == [200] * 3
    assert len(script.calls("summary")) == 1
    received = {orjson.dumps(body["messages"][-2:]) for body in forwarded(script)}
    assert received == {orjson.dumps(m[-2:]) for m in sent}


async def test_precompute_prepares_the_checkpoint_before_the_trigger(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6, "summary_timeout_s": 5})
    messages = conversation_of(int(WINDOW * 0.7))
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "none"
    assert script.calls(None)[0].body == orjson.dumps({"model": "gpt-test", "messages": messages})
    await wait_for(lambda: len(proxy.app[keys.RECORDS].get("agent-1")["records"]) == 1)

    blocked = asyncio.Event()

    async def never(request: web.Request) -> web.StreamResponse:
        await blocked.wait()
        raise AssertionError("unreachable")

    script.summary = never  # a request that had to summarize now would time out
    grown = conversation_of(int(WINDOW * 0.88), grow=messages)
    response = await post(client, proxy, grown)
    # The conversation's first compaction goes out now, prepared in advance: "applied".
    assert response.headers["x-compaction-status"] == "applied", response.headers
    record = proxy.app[keys.RECORDS].get("agent-1")["records"][0]
    assert record["reason"] == "precompute"
    # Served from the precomputed checkpoint. The view now keeps as much as fits the target, so
    # it is past the precompute ratio again and the next step may be prepared in the background
    # (that call hangs on `never`); the request itself never waited for a summary.
    assert response.headers["x-compaction-id"] == record["id"]
    again = await post(client, proxy, [*grown, f.assistant("ok"), f.user("go on")])
    assert again.headers["x-compaction-status"] == "reused"


async def test_a_precomputed_checkpoint_waits_in_reserve_until_the_trigger(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6})
    records = proxy.app[keys.RECORDS]
    messages = conversation_of(int(WINDOW * 0.9))
    first = await post(client, proxy, messages)  # over the trigger: compacted now
    assert first.headers["x-compaction-status"] == "applied"
    first_id = first.headers["x-compaction-id"]
    # Grow until the forwarded view passes the precompute ratio, so a reserve gets prepared.
    while True:
        messages = conversation_of(tokens(messages) + 150, grow=messages)
        response = await post(client, proxy, messages)
        if int(response.headers["x-compaction-tokens-after"]) >= 0.6 * WINDOW:
            break
    await wait_for(lambda: len(records.get("agent-1")["records"]) == 2)
    assert records.get("agent-1")["records"][1]["reason"] == "precompute"
    # Below the trigger, the view built on the first checkpoint is still what goes upstream.
    messages = [*messages, f.assistant("ok"), f.user("next")]
    response = await post(client, proxy, messages)
    assert int(response.headers["x-compaction-tokens-after"]) < 0.85 * WINDOW
    assert response.headers["x-compaction-id"] == first_id
    # Once that view reaches the trigger, the reserve is used without a new summary (the view
    # then keeps as much as fits the target, so the next reserve may be prepared in the
    # background: a "precompute" record, never a "trigger" one).
    messages = conversation_of(int(tokens(messages) + 0.3 * WINDOW), grow=messages)
    response = await post(client, proxy, messages)
    assert response.headers["x-compaction-status"] == "applied"  # new to the conversation
    assert response.headers["x-compaction-id"] == records.get("agent-1")["records"][1]["id"]
    assert all(r["reason"] == "precompute" for r in records.get("agent-1")["records"][1:])


async def test_a_quiet_conversation_does_not_silence_another_in_the_same_session(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6})
    records = proxy.app[keys.RECORDS]
    a = conversation_of(int(WINDOW * 0.75))
    await post(client, proxy, a)
    await wait_for(lambda: len(records.get("agent-1")["records"]) == 1)
    await post(client, proxy, conversation_of(tokens(a) + 100, grow=a))  # finds the reserve: quiet
    b = conversation_of(int(WINDOW * 0.7))
    b[1] = f.user("A different task altogether.")
    await post(client, proxy, b)
    await wait_for(lambda: len(records.get("agent-1")["records"]) == 2)
    assert [r["reason"] for r in records.get("agent-1")["records"]] == ["precompute", "precompute"]


async def test_a_client_that_leaves_during_a_summary_does_not_waste_it(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start()
    release = asyncio.Event()
    answer = Script.answer(SUMMARY_TEXT)

    async def gated(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return await answer(request)

    script.summary = gated
    messages = conversation_of(int(WINDOW * 1.2))
    leaving = asyncio.ensure_future(post(client, proxy, messages))
    await wait_for(lambda: len(script.calls("summary")) == 1)
    leaving.cancel()  # the client goes away while its request waits for the summary
    with pytest.raises(asyncio.CancelledError):
        await leaving
    release.set()
    records = proxy.app[keys.RECORDS]
    await wait_for(lambda: len((records.get("agent-1") or {"records": []})["records"]) == 1)
    again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    # The first request never went out: this one is the first to carry the compaction.
    assert again.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 1


async def test_a_summary_that_outlives_its_request_is_used_once_it_lands(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(compaction={"summary_timeout_s": 0.3})
    answer = Script.answer(SUMMARY_TEXT)

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.6)  # longer than a request waits, shorter than the call may take
        return await answer(request)

    script.summary = slow
    messages = conversation_of(int(WINDOW * 1.2))
    first = await post(client, proxy, messages)
    assert first.headers["x-compaction-status"] == "applied"
    assert (
        "The user wants the failing tests fixed"
        not in forwarded(script)[0]["messages"][1]["content"]
    )
    records = proxy.app[keys.RECORDS]
    await wait_for(lambda: bool((records.get("agent-1") or {"records": []})["records"]))
    record = records.get("agent-1")["records"][0]
    assert record["path"] == "llm"
    second = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    # The model's summary replaces the fallback the first request carried: a new compaction.
    assert second.headers["x-compaction-status"] == "applied"
    assert second.headers["x-compaction-id"] == record["id"]
    assert (
        "The user wants the failing tests fixed" in forwarded(script)[1]["messages"][1]["content"]
    )


async def test_a_precomputed_compaction_writes_memory_only_when_applied(
    start: Any, script: Script, client: Any, tmp_path: Any
) -> None:
    proxy = await start(compaction={"precompute_ratio": 0.6})
    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    messages = conversation_of(int(WINDOW * 0.7))
    await post(client, proxy, messages)
    records = proxy.app[keys.RECORDS]
    await wait_for(lambda: len(records.get("agent-1")["records"]) == 1)
    assert records.get("agent-1")["records"][0]["memory_items"] > 0
    assert not memory_file.exists()  # prepared, not applied: nothing written yet
    grown = conversation_of(int(WINDOW * 0.88), grow=messages)
    response = await post(client, proxy, grown)
    assert response.headers["x-compaction-status"] == "applied"
    lines = memory_file.read_text().splitlines()
    assert lines and all(
        orjson.loads(line)["compaction_id"] == records.get("agent-1")["records"][0]["id"]
        for line in lines
    )


async def test_a_request_at_the_trigger_waits_for_a_precompute_still_planning(
    start_proxy: StartProxy, upstream: FakeUpstream, script: Script, client: Any
) -> None:
    # On first use the worker pool takes about a second to start: the precompute is still
    # planning (what it will fold is not known yet) when the next request reaches the trigger.
    sections: dict[str, Any] = {
        "models": {"default_context_window": WINDOW},
        "compaction": {"keep_recent_rounds": 2, "summary_max_tokens": 300, "precompute_ratio": 0.6},
    }
    offload = SlowFirstPlan(delay_s=0.3)
    records = SessionRecords(max_sessions=10, records_per_session=10)
    async with with_hook(
        start_proxy, upstream, sections, offload=offload, records=records
    ) as proxy:
        messages = conversation_of(int(WINDOW * 0.8))
        assert (await post(client, proxy, messages)).headers["x-compaction-status"] == "none"
        await asyncio.wait_for(offload.planning.wait(), timeout=5)
        answered = [*messages, f.assistant("Round summarized."), f.user("(grown from here)")]
        response = await post(client, proxy, conversation_of(int(WINDOW * 0.88), grow=answered))
        # One summarization for this growth step: the precompute's, which goes out now.
        (record,) = records.get("agent-1")["records"]
        assert record["reason"] == "precompute"
        assert response.headers["x-compaction-status"] == "applied"
        assert response.headers["x-compaction-id"] == record["id"]
        assert len(script.calls("summary")) == 1


def hold_summary_until(script: Script, proxy: RunningProxy, *, in_flight: int) -> None:
    """The summary is answered only once `in_flight` requests are inside the proxy, so that
    they surely overlap."""
    answer = Script.answer(SUMMARY_TEXT)
    registry = proxy.app[keys.METRICS].registry

    async def held_summary(request: web.Request) -> web.StreamResponse:
        await wait_for(
            lambda: registry.get_sample_value("compaction_proxy_in_flight_requests") == in_flight
        )
        return await answer(request)

    script.summary = held_summary
