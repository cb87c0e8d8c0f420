"""The session records /admin shows, in a real redis-server (proxy.state.redis_records): two
replicas behind one Redis each show the whole conversation, and the records stay within their
bounds per session and in total."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from proxy.metrics import Metrics
from proxy.settings import AdminSettings, ArchiveSettings, CompactionSection, StateSettings
from proxy.state.factory import build_state
from proxy.state.redis_client import RedisClient
from proxy.state.redis_records import SESSION_BYTES, RedisRecords
from proxy.state.roles import SessionChange
from proxy.tasks import BackgroundTasks
from tests import factories as f
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.state.conftest import ProxyProcess, RedisServer, SpawnProxy, free_port

TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def _admin(client: aiohttp.ClientSession, proxy: ProxyProcess, path: str) -> Any:
    async with client.get(f"{proxy.url}{path}", headers=ADMIN) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def _session_when(
    client: aiohttp.ClientSession, proxy: ProxyProcess, requests: int
) -> dict[str, Any]:
    """The dashboard's view of agent-1 (/admin/api/sessions/agent-1: totals, records, timeline)
    once it counts `requests` (the replicas send their records to Redis in the background, a
    moment after each answer)."""
    found: dict[str, Any] = {}
    for _ in range(250):
        found = await _admin(client, proxy, "/admin/api/sessions/agent-1")
        if found["requests"] >= requests and len(found["timeline"]) >= requests:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"never counted {requests} requests: {found.get('requests')}")


async def test_each_replica_shows_every_request_and_compaction_of_a_conversation_split_between_them(
    spawn: SpawnProxy, redis_server: RedisServer, client: aiohttp.ClientSession
) -> None:
    state = {"backend": "redis", "redis_url": redis_server.url}
    replicas = [
        await spawn(name, state=state, admin={"token": TOKEN}, compaction={"recall": "off"})
        for name in ("a", "b")
    ]
    messages = conversation_of(int(WINDOW * 0.5))
    statuses, applied = [], set()
    for i in range(16):  # one conversation, alternating between the replicas, as a balancer would
        messages = conversation_of(int(WINDOW * (0.5 + 0.12 * i)), grow=messages)
        response = await post(client, replicas[i % 2], messages)
        assert response.status == 200
        statuses.append(response.headers["x-compaction-status"])
        if statuses[-1] == "applied":
            applied.add(response.headers["x-compaction-id"])
        messages = [*messages, f.assistant(f"Done with step {i}.")]
    assert len(applied) >= 2  # compactions on both sides of the split, not one

    views = []
    for replica in replicas:
        found = await _session_when(client, replica, 16)
        assert found["requests"] == 16
        assert [line["status"] for line in found["timeline"]] == statuses
        # Every compaction a request went out with, whichever replica made it. (A replica that
        # summarized too, and lost the race to store its checkpoint, recorded its compaction
        # as well: there may be more records than compactions forwarded, never fewer.)
        ids = [record["id"] for record in found["records"]]
        assert applied <= set(ids) and len(set(ids)) == len(ids) == found["records_total"]
        forwarded_ids = {line["compaction_id"] for line in found["timeline"]} - {None}
        assert forwarded_ids <= set(ids)
        assert found["tokens_saved"] > 0
        listed = await _admin(client, replica, "/admin/sessions")
        assert [(s["session_id"], s["requests"]) for s in listed["sessions"]] == [("agent-1", 16)]
        page = await _admin(client, replica, "/admin/api/sessions?sort=requests")
        assert [(s["session_id"], s["records_total"]) for s in page["sessions"]] == [
            ("agent-1", len(ids))
        ]
        shown = await _admin(client, replica, "/admin/sessions/agent-1")
        assert shown["requests"] == 16 and [r["id"] for r in shown["records"]] == ids
        views.append(found)
    assert views[0] == views[1]  # one view of the fleet, from either replica


def _line(n: int) -> dict[str, Any]:
    return {"time": f"t{n}", "status": "none", "bytes_before": n}


async def test_the_shared_records_keep_their_bounds_per_session_and_in_total(
    redis_server: RedisServer,
) -> None:
    tasks = BackgroundTasks()
    client = RedisClient(redis_server.url, timeout_s=2, max_connections=4)
    records = RedisRecords(
        client,
        per_session=3,
        max_sessions=3,
        max_bytes=4 * SESSION_BYTES,
        metrics=Metrics().state,
        tasks=tasks,
    )
    await records.open()
    try:
        for n in range(5):  # five lines and records: the newest three stay
            change = SessionChange(requests=1, timeline=_line(n), record={"id": f"c{n}"})
            records.add("a", change, 1000.0 + n)
        for n, sid in enumerate(("b", "c")):
            records.add(sid, SessionChange(requests=1), 2000.0 + n)
        await records.close()  # sends what is queued
        await records.open()
        found = await records.session("a")
        assert found is not None
        assert [line["bytes_before"] for line in found.timeline] == [2, 3, 4]
        assert [record["id"] for record in found.records] == ["c2", "c3", "c4"]
        assert (found.totals.requests, found.totals.records_kept) == (5, 3)

        # A fourth session: past max_sessions, the least recently seen (a) goes whole.
        records.add("d", SessionChange(requests=1), 3000.0)
        await records.close()
        await records.open()
        assert await records.session("a") is None
        assert [sid for sid, _ in await records.every()] == ["d", "c", "b"]
        newest, total = await records.newest(1, 1)
        assert ([sid for sid, _ in newest], total) == (["c"], 3)

        # A session whose documents pass max_bytes pushes the others out, never itself.
        big = SessionChange(record={"summary": "x" * (3 * SESSION_BYTES)})
        records.add("e", big, 4000.0)
        await records.close()
        await records.open()
        assert [sid for sid, _ in await records.every()] == ["e"]
        redis = client.get()
        held = orjson.loads(await redis.hget("compaction-proxy:records:totals", "e"))
        assert int(await redis.get("compaction-proxy:records:bytes")) == held["bytes"]
        assert sorted(await redis.keys("compaction-proxy:records:*")) == [
            b"compaction-proxy:records:bytes",
            b"compaction-proxy:records:records:e",
            b"compaction-proxy:records:seen",
            b"compaction-proxy:records:totals",
        ]
        assert list(await redis.hkeys("compaction-proxy:records:totals")) == [b"e"]
    finally:
        await records.close()
        await tasks.close()


async def test_without_redis_requests_go_through_and_admin_shows_the_replicas_own_records(
    spawn: SpawnProxy, client: aiohttp.ClientSession
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    proxy = await spawn(
        "alone", state={"backend": "redis", "redis_url": nowhere}, admin={"token": TOKEN}
    )
    messages = conversation_of(int(WINDOW * 0.5))
    for _ in range(2):
        response = await post(client, proxy, messages)
        assert response.status == 200
    found = await _session_when(client, proxy, 2)
    assert found["requests"] == 2 and len(found["timeline"]) == 2
    listed = await _admin(client, proxy, "/admin/sessions")
    assert [s["session_id"] for s in listed["sessions"]] == ["agent-1"]
    for _ in range(250):  # what could not be written is counted
        if await _records_not_written(client, proxy) >= 4:  # 2 requests, 2 timeline lines
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not counted: {await _records_not_written(client, proxy)}")


async def _records_not_written(client: aiohttp.ClientSession, proxy: ProxyProcess) -> float:
    async with client.get(f"{proxy.url}/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("compaction_proxy_state_errors_total{") and 'operation="records"' in line
    )


def test_the_records_are_shared_only_with_redis_and_admin_on() -> None:
    metrics, tasks = Metrics().state, BackgroundTasks()
    redis = StateSettings(backend="redis", redis_url="redis://127.0.0.1:1/0")
    sqlite = StateSettings(backend="sqlite", path=":memory:")
    on, off = AdminSettings(token="t"), AdminSettings()
    options, archive = CompactionSection(), ArchiveSettings()

    def shared(state: StateSettings, admin: AdminSettings) -> object:
        return build_state(state, options, archive, metrics, tasks, admin=admin).records

    assert isinstance(shared(redis, on), RedisRecords)
    assert shared(redis, off) is None  # /admin off: nobody would read them
    assert shared(sqlite, on) is None  # in the process, as they always were
