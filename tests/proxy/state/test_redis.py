"""Replicas sharing a real redis-server: checkpoints reused across processes, one summarization
for concurrent requests on different replicas, and requests that never fail when Redis does."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import orjson
from aiohttp import web

from tests import factories as f
from tests.fakes.script import SUMMARY_TEXT, Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, forwarded, post, wait_for
from tests.proxy.compacting.test_reserve_writes import just_under_the_trigger
from tests.proxy.state.conftest import RedisServer, SpawnProxy, free_port, redis_binary


def _redis(url: str, **more: Any) -> dict[str, Any]:
    return {"backend": "redis", "redis_url": url, **more}


async def test_a_conversation_compacted_on_one_replica_is_reused_on_the_other(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any
) -> None:
    a = await spawn("a", state=_redis(redis_server.url))
    b = await spawn("b", state=_redis(redis_server.url))
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, a, messages)
    assert first.headers["x-compaction-status"] == "applied"
    messages = [*messages, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    second = await post(client, b, messages)
    assert second.headers["x-compaction-status"] == "reused"
    assert second.headers["x-compaction-id"] == first.headers["x-compaction-id"]
    assert len(script.calls("summary")) == 1
    before, after = (sent["messages"] for sent in forwarded(script))
    assert orjson.dumps(before[:2]) == orjson.dumps(after[:2])


async def test_concurrent_requests_split_across_replicas_cause_one_summarization(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any
) -> None:
    a = await spawn("a", state=_redis(redis_server.url))
    b = await spawn("b", state=_redis(redis_server.url))
    answer = Script.answer(SUMMARY_TEXT)

    async def slow_summary(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(1.0)  # long enough for all ten requests to be inside the proxies
        return await answer(request)

    script.summary = slow_summary
    messages = conversation_of(int(WINDOW * 1.2))
    responses = await asyncio.gather(
        *(post(client, a if i % 2 else b, messages) for i in range(10))
    )
    assert [r.status for r in responses] == [200] * 10
    # "reused" for those that waited on a summarization their own replica was waiting for.
    assert {r.headers["x-compaction-status"] for r in responses} <= {"applied", "reused"}
    assert len({r.headers["x-compaction-id"] for r in responses}) == 1
    assert len(script.calls("summary")) == 1
    assert len({orjson.dumps(sent["messages"]) for sent in forwarded(script)}) == 1


async def test_redis_unreachable_at_start_fails_no_request_and_is_picked_up_later(
    spawn: SpawnProxy, script: Script, client: Any
) -> None:
    server = RedisServer(redis_binary(), free_port())
    proxy = await spawn(state=_redis(server.url, retry_s=0.2))
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, proxy, messages)
    assert first.status == 200
    assert first.headers["x-compaction-status"] == "applied"
    messages = [*messages, f.assistant("ok"), f.user("go on")]
    second = await post(client, proxy, messages)
    assert second.headers["x-compaction-status"] == "reused"
    assert await proxy.metric(client, "compaction_proxy_state_degraded") == 1
    assert await proxy.metric(client, "compaction_proxy_state_outages_total") == 1
    await server.start()
    try:
        await asyncio.sleep(0.3)
        third = await post(client, proxy, [*messages, f.assistant("ok"), f.user("more")])
        assert third.status == 200
        assert await proxy.metric(client, "compaction_proxy_state_degraded") == 0
        assert proxy.log.read_text().count("state backend unavailable") == 1
    finally:
        await server.stop()


async def test_redis_going_away_mid_run_fails_no_request_and_compaction_goes_on(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any
) -> None:
    proxy = await spawn(state=_redis(redis_server.url))
    messages = conversation_of(int(WINDOW * 1.1))
    assert (await post(client, proxy, messages)).headers["x-compaction-status"] == "applied"
    await redis_server.stop()
    messages = [*messages, f.assistant("ok"), f.user("go on")]
    reused = await post(client, proxy, messages)
    assert reused.status == 200
    assert reused.headers["x-compaction-status"] == "reused"
    other = conversation_of(int(WINDOW * 1.1))
    fresh = await post(client, proxy, other, session="agent-2")
    assert fresh.status == 200
    assert fresh.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 2
    assert await proxy.metric(client, "compaction_proxy_state_errors_total") >= 1


async def test_a_replica_dying_mid_summary_holds_the_others_back_at_most_the_summary_timeout(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any
) -> None:
    timeout_s = 2.0
    options = {"summary_timeout_s": timeout_s}
    a = await spawn("a", state=_redis(redis_server.url), compaction=options)
    b = await spawn("b", state=_redis(redis_server.url), compaction=options)
    answer = Script.answer(SUMMARY_TEXT)
    hung = asyncio.Event()

    async def first_hangs(request: web.Request) -> web.StreamResponse:
        if not hung.is_set():
            hung.set()
            await asyncio.sleep(3600)
        return await answer(request)

    script.summary = first_hangs
    messages = conversation_of(int(WINDOW * 1.1))
    doomed = asyncio.ensure_future(post(client, a, messages))
    await asyncio.wait_for(hung.wait(), 10)
    await a.stop(signal.SIGKILL)  # holding the lease, mid-summary
    started = time.monotonic()
    response = await post(client, b, messages)
    assert response.status == 200
    assert response.headers["x-compaction-status"] == "applied"
    # Waited for the dead replica's lease at most the summary timeout, then went out on the
    # fallback (the margin is for a loaded machine).
    assert time.monotonic() - started < timeout_s + 2.0
    # B takes the summary over once the dead replica's lease expires, and stores it.
    await wait_for(lambda: len(script.calls("summary")) == 2, timeout_s=10)
    later = [*messages, f.assistant("ok"), f.user("go on")]
    for _ in range(100):
        again = await post(client, b, later)
        if again.headers["x-compaction-status"] == "reused":
            break
        await asyncio.sleep(0.1)
    assert again.headers["x-compaction-status"] == "reused"
    doomed.cancel()


async def test_the_next_request_on_another_replica_waits_for_the_compaction_under_way(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any
) -> None:
    """An agent's next, longer request lands on the other replica while the first replica still
    summarizes: it waits for that summary instead of writing its own."""
    a = await spawn("a", state=_redis(redis_server.url))
    b = await spawn("b", state=_redis(redis_server.url))
    answer = Script.answer(SUMMARY_TEXT)
    summarizing = asyncio.Event()

    async def slow_summary(request: web.Request) -> web.StreamResponse:
        summarizing.set()
        await asyncio.sleep(1.0)
        return await answer(request)

    script.summary = slow_summary
    messages = conversation_of(int(WINDOW * 1.1))
    first = asyncio.ensure_future(post(client, a, messages))
    await asyncio.wait_for(summarizing.wait(), 10)
    later = [*messages, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    second = await post(client, b, later)
    assert (await first).headers["x-compaction-status"] == "applied"
    # Both went out with the new compaction at about the same time: "applied" or "reused".
    assert second.headers["x-compaction-status"] in ("applied", "reused")
    assert second.headers["x-compaction-id"] == (await first).headers["x-compaction-id"]
    assert len(script.calls("summary")) == 1


async def test_replicas_writing_one_memory_directory_write_each_item_once(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any, tmp_path: Any
) -> None:
    """B has read the session's memory file before A added an item to it; when B later finds the
    same item, the shared claims in Redis keep it from being written twice."""
    # The scripted model's memory items: asked standalone (at this small window's end a cached
    # summarizer leaves them to code, with no second transcript).
    standalone = {"summary_request": "standalone"}
    a = await spawn("a", state=_redis(redis_server.url), compaction=standalone)
    b = await spawn("b", state=_redis(redis_server.url), compaction=standalone)

    def history(opening: str) -> list[dict[str, Any]]:
        return [f.system(opening), *conversation_of(int(WINDOW * 1.1))[1:]]

    def remembers(text: str) -> None:
        script.memory = Script.answer(
            orjson.dumps([{"type": "decision", "content": text}]).decode()
        )

    remembers("Ship on Friday.")
    assert (await post(client, b, history("one"))).headers["x-compaction-status"] == "applied"
    remembers("Keep the standard library only.")
    assert (await post(client, a, history("two"))).headers["x-compaction-status"] == "applied"
    assert (await post(client, b, history("three"))).headers["x-compaction-status"] == "applied"
    lines = (tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl").read_bytes().splitlines()
    contents = [orjson.loads(line)["content"] for line in lines]
    assert contents.count("Ship on Friday.") == 1
    assert contents.count("Keep the standard library only.") == 1


async def test_a_reserve_prepared_on_one_replica_writes_its_memory_once_where_it_goes_out(
    spawn: SpawnProxy, redis_server: RedisServer, script: Script, client: Any, tmp_path: Any
) -> None:
    precompute = {"precompute_ratio": 0.6}
    a = await spawn("a", state=_redis(redis_server.url), compaction=precompute)
    b = await spawn("b", state=_redis(redis_server.url), compaction=precompute)
    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    messages = just_under_the_trigger()
    assert (await post(client, a, messages)).headers["x-compaction-status"] == "none"
    for _ in range(250):  # A prepares the reserve in the background
        if await a.metric(client, "compaction_proxy_compactions_total") == 1:
            break
        await asyncio.sleep(0.02)
    assert not memory_file.exists()  # prepared, not applied

    grown = [*messages, f.assistant("Sure."), f.user("Next? " * 10)]
    applied = await post(client, b, grown)  # over the trigger, on the other replica
    assert applied.headers["x-compaction-status"] == "applied"
    lines = memory_file.read_bytes().splitlines()
    assert lines
    assert {orjson.loads(line)["compaction_id"] for line in lines} == {
        applied.headers["x-compaction-id"]
    }
    again = await post(client, a, [*grown, f.assistant("Done."), f.user("More?")])
    assert again.headers["x-compaction-status"] == "reused"
    assert memory_file.read_bytes().splitlines() == lines  # written once, by one replica
    assert len(script.calls("summary")) == 1
