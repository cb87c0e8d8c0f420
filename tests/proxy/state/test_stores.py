"""The backends on their own: a SQLite file across reopenings (expiry, size bound, unreadable
rows, batched writes, cooldowns) and a real Redis shared by two stores (first writer wins,
expiry, cooldowns, leases with fencing, waiters woken by a notice)."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from compaction.checkpoints import Checkpoint, conversation_seed, prefix_digests
from compaction.marker import SUMMARY_MARKER
from proxy.compacting.background.flight import run_once_everywhere
from proxy.compacting.decision.applied import AppliedCompactions
from proxy.compacting.decision.conversations import stored_under
from proxy.metrics import StateMetrics
from proxy.settings import ArchiveSettings, CompactionSection, StateSettings
from proxy.state.factory import build_state
from proxy.state.local import LocalStore
from proxy.state.redis import RedisStore
from proxy.state.redis_client import RedisClient
from proxy.state.sqlite import CheckpointTables, SqliteStore
from proxy.state.sqlite_file import StateFile
from proxy.tasks import BackgroundTasks
from tests import factories as f
from tests.proxy.state.conftest import RedisServer

SEED = conversation_seed("Bearer sk-client", "agent-1")
DIGESTS = prefix_digests([f.system(), *(f.user(f"question {i}") for i in range(12))], SEED)


def _checkpoint(cut: int, text: str = "summary", digests: Sequence[bytes] = DIGESTS) -> Checkpoint:
    summary = {"role": "user", "content": f"{SUMMARY_MARKER}\n{text} up to {cut}"}
    return Checkpoint(digests[cut - 1], cut, 1, (), summary, f"c{cut}", "llm")


def _sqlite(
    path: Path, now: list[float], metrics: StateMetrics | None = None, **options: Any
) -> SqliteStore:
    """A store over a state file of its own (the file and the store on the same clock)."""
    settings = {
        "max_entries": 100,
        "ttl_s": 60.0,
        "failure_threshold": 3,
        "failure_cooldown_s": 30.0,
    }
    file = StateFile(
        path, metrics=metrics or StateMetrics(CollectorRegistry()), clock=lambda: now[0]
    )
    return SqliteStore(file, clock=lambda: now[0], **{**settings, **options})


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        return int(connection.execute("SELECT count(*) FROM checkpoints").fetchone()[0])


async def test_sqlite_checkpoints_are_found_again_after_reopening(tmp_path: Path) -> None:
    now = [1000.0]
    store = _sqlite(tmp_path / "state.sqlite3", now)
    await store.open()
    await store.put(_checkpoint(3))
    await store.put(_checkpoint(7))
    await store.close()
    again = _sqlite(tmp_path / "state.sqlite3", now)
    await again.open()
    found = await again.longest(DIGESTS)
    assert found == _checkpoint(7)
    assert await again.longest(DIGESTS[:6]) == _checkpoint(3)
    assert await again.longest(prefix_digests([f.system()], conversation_seed("other"))) is None
    await again.close()
    with sqlite3.connect(tmp_path / "state.sqlite3") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert (tmp_path / "state.sqlite3").stat().st_mode & 0o777 == 0o600


async def test_sqlite_rows_expire_and_are_pruned_from_the_file(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now, ttl_s=5.0)
    await store.open()
    await store.put(_checkpoint(3))
    now[0] += 6
    assert await store.longest(DIGESTS) is None
    await store.close()
    reopened = _sqlite(path, now, ttl_s=5.0)
    await reopened.open()
    assert _rows(path) == 0
    await reopened.close()


async def test_the_sqlite_file_keeps_at_most_max_entries_newest_first(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now, max_entries=3)
    await store.open()
    for cut in range(1, 8):
        now[0] += 1
        await store.put(_checkpoint(cut))
    assert _rows(path) == 3
    assert await store.longest(DIGESTS[:4]) is None  # evicted
    assert await store.longest(DIGESTS) == _checkpoint(7)
    await store.close()


async def test_the_sqlite_store_keeps_no_more_checkpoints_in_memory_than_the_file(
    tmp_path: Path,
) -> None:
    # A reserve's checkpoint carries its memory items: a cache sized apart from max_entries kept
    # up to 1,024 of them alive, their keys long forgotten (RSS rising in the soak).
    now = [1000.0]
    store = _sqlite(tmp_path / "state.sqlite3", now, max_entries=3)
    await store.open()
    alive = []
    for cut in range(1, 8):
        now[0] += 1
        checkpoint = _checkpoint(cut)
        alive.append(weakref.ref(checkpoint))
        await store.put(checkpoint)
    del checkpoint
    gc.collect()
    assert sum(ref() is not None for ref in alive) == 3  # the three newest, as in the file
    assert await store.longest(DIGESTS) == _checkpoint(7)
    await store.close()


async def test_a_guarded_backend_keeps_state_cached_checkpoints_in_memory_and_reads_the_rest(
    tmp_path: Path,
) -> None:
    # The guard's fallback cache was bounded by compaction.checkpoint_max_entries (10,000 by
    # default): every checkpoint the process wrote or read stayed decoded in it, RSS rising
    # through the whole 10-minute soak while the file kept them anyway.
    settings = StateSettings(path=tmp_path / "state.sqlite3", cached_checkpoints=3)
    tasks = BackgroundTasks()
    metrics = StateMetrics(CollectorRegistry())
    state = build_state(settings, CompactionSection(), ArchiveSettings(), metrics, tasks)
    await state.open()
    backend = state.backend
    alive = []
    for cut in range(1, 8):
        checkpoint = _checkpoint(cut)
        alive.append(weakref.ref(checkpoint))
        await backend.put(checkpoint)
    del checkpoint
    gc.collect()
    assert sum(ref() is not None for ref in alive) == 3
    assert await backend.longest(DIGESTS[:2]) == _checkpoint(2)  # read back from the file
    await state.close()
    await tasks.close()


async def test_concurrent_sqlite_writes_all_land(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now)
    await store.open()
    digests = [
        prefix_digests([f.system(), f.user("q")], conversation_seed(str(i))) for i in range(50)
    ]
    await asyncio.gather(*(store.put(_checkpoint(2, digests=d)) for d in digests))
    await store.close()
    assert _rows(path) == 50


async def test_a_sqlite_row_of_another_version_is_a_miss(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now)
    await store.open()
    await store.put(_checkpoint(3))
    await store.close()
    with sqlite3.connect(path) as connection:
        connection.execute(
            "UPDATE checkpoints SET body = replace(body, '\"version\":1', '\"version\":9')"
        )
    reopened = _sqlite(path, now)
    await reopened.open()
    assert await reopened.longest(DIGESTS) is None
    await reopened.close()


async def test_a_sqlite_cooldown_outlives_the_process(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now)
    await store.open()
    for _ in range(3):
        await store.record_outcome("model\x00tenant", ok=False)
    assert await store.is_cooling("model\x00tenant")
    await store.close()
    reopened = _sqlite(path, now)
    await reopened.open()
    assert await reopened.is_cooling("model\x00tenant")
    assert not await reopened.is_cooling("model\x00other")
    now[0] += 31
    assert not await reopened.is_cooling("model\x00tenant")
    await reopened.close()


async def test_sqlite_failures_a_day_old_are_pruned_and_no_longer_count(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now)
    await store.open()
    await store.record_outcome("model\x00tenant", ok=False)  # below the threshold of 3
    await store.close()
    now[0] += 2 * 86400
    reopened = _sqlite(path, now)
    await reopened.open()
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM cooldowns").fetchone()[0] == 0
    await reopened.record_outcome("model\x00tenant", ok=False)
    await reopened.record_outcome("model\x00tenant", ok=False)
    assert not await reopened.is_cooling("model\x00tenant")
    await reopened.close()


# -- redis ---------------------------------------------------------------------------------------


@pytest.fixture
async def stores(redis_server: RedisServer) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    pair = tuple(_redis(redis_server.url) for _ in range(2))
    for store in pair:
        await store.open()
    yield pair  # type: ignore[misc]
    for store in pair:
        await store.close()


def _redis(
    url: str,
    ttl_s: float = 60.0,
    lease_ttl_s: float = 5.0,
    tasks: BackgroundTasks | None = None,
    max_connections: int = 32,
) -> RedisStore:
    return RedisStore(
        RedisClient(url, timeout_s=2.0, max_connections=max_connections),
        ttl_s=ttl_s,
        failure_threshold=3,
        failure_cooldown_s=30,
        lease_ttl_s=lease_ttl_s,
        tasks=BackgroundTasks() if tasks is None else tasks,
        # Waiters re-check rarely here, so a lost notice shows as a long wait, never hides.
        recheck_s=30.0,
    )


async def test_on_redis_the_first_writer_of_a_checkpoint_wins(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = stores
    await a.put(_checkpoint(5, "from a"))
    await b.put(_checkpoint(5, "from b"))
    assert await b.longest(DIGESTS) == _checkpoint(5, "from a")
    await b.put(_checkpoint(9, "from b"))
    assert await a.longest(DIGESTS) == _checkpoint(9, "from b")
    assert await a.longest(DIGESTS[:8]) == _checkpoint(5, "from a")
    assert await a.longest([]) is None


async def test_redis_checkpoints_expire(redis_server: RedisServer) -> None:
    store = _redis(redis_server.url, ttl_s=0.2)
    await store.open()
    try:
        await store.put(_checkpoint(4))
        await asyncio.sleep(0.4)
        other = _redis(redis_server.url)
        await other.open()
        assert await other.longest(DIGESTS) is None
        await other.close()
    finally:
        await store.close()


async def test_a_redis_checkpoint_of_another_version_is_a_miss(
    stores: tuple[RedisStore, RedisStore], redis_server: RedisServer
) -> None:
    a, _ = stores
    await a.put(_checkpoint(6))
    client = aioredis.from_url(redis_server.url)
    key = b"compaction-proxy:cp:v1:" + DIGESTS[5]
    body = await client.hget(key, "body")
    await client.hset(key, "body", body.replace(b'"version":1', b'"version":9'))
    await client.aclose()
    fresh = _redis(redis_server.url)
    await fresh.open()
    assert await fresh.longest(DIGESTS) is None
    await fresh.close()


async def test_a_cooldown_on_one_replica_holds_on_the_other(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = stores
    for _ in range(2):
        await a.record_outcome("m\x00t", ok=False)
    assert not await b.is_cooling("m\x00t")
    await b.record_outcome("m\x00t", ok=False)
    assert await a.is_cooling("m\x00t") and await b.is_cooling("m\x00t")
    assert not await a.is_cooling("m\x00other-tenant")
    await a.record_outcome("m\x00t", ok=True)
    assert not await b.is_cooling("m\x00t")


async def test_a_lease_is_held_once_and_a_stale_holder_cannot_release_its_successor(
    redis_server: RedisServer,
) -> None:
    a_work = BackgroundTasks()
    a = _redis(redis_server.url, lease_ttl_s=0.3, tasks=a_work)
    b, c = _redis(redis_server.url, lease_ttl_s=5), _redis(redis_server.url, lease_ttl_s=5)
    for store in (a, b, c):
        await store.open()
    try:
        key = DIGESTS[4]
        stale = await a.acquire(key)
        assert stale is not None
        assert await b.acquire(key) is None
        await a_work.close()  # a's holder died, renewal with it
        await asyncio.sleep(0.5)  # and its lease expired
        successor = await b.acquire(key)
        assert successor is not None
        assert not await stale.renew()
        await stale.release()
        assert await c.acquire(key) is None  # the successor still holds it
        await successor.release()
        assert await c.acquire(key) is not None
    finally:
        for store in (a, b, c):
            await store.close()


async def test_a_waiting_replica_is_woken_by_the_release_notice(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = stores
    key = DIGESTS[4]
    lease = await a.acquire(key)
    assert lease is not None

    async def finish() -> None:
        await asyncio.sleep(0.2)
        await a.put(_checkpoint(5))
        await lease.release()

    started = time.monotonic()
    await asyncio.gather(b.wait(key, 20.0), finish())
    # Woken by the notice, not by the lease's 5 s expiry (nor a re-check, every 30 s here).
    assert time.monotonic() - started < 3.0
    assert await b.longest(DIGESTS) == _checkpoint(5)


async def test_a_checkpoint_stored_under_another_cut_is_a_miss(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    a, _ = stores
    await a.put(replace(_checkpoint(5), key=DIGESTS[2]))
    assert await a.longest(DIGESTS) is None


async def test_a_sqlite_write_given_up_leaves_the_rest_of_its_batch_to_finish(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    state = StateFile(path, metrics=StateMetrics(CollectorRegistry()), clock=time.time)
    state.attach(CheckpointTables(max_entries=100))
    await state.open()
    insert = "INSERT OR REPLACE INTO forwarded (id, expires_at) VALUES (?, ?)"
    expires_at = time.time() + 60
    # Another connection holds the write lock (within busy_timeout), so the writer thread waits
    # on the first row while the next two queue up as one batch.
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    first = asyncio.ensure_future(state.write(insert, ("first", expires_at)))
    await asyncio.sleep(0.05)
    given_up = asyncio.ensure_future(state.write(insert, ("given-up", expires_at)))
    batched = asyncio.ensure_future(state.write(insert, ("batched", expires_at)))
    await asyncio.sleep(0.05)
    given_up.cancel()  # what the guard's timeout does to a slow write
    await asyncio.sleep(0.05)
    locker.execute("ROLLBACK")
    locker.close()
    await asyncio.wait_for(first, 5)
    await asyncio.wait_for(batched, 5)
    await state.close()
    with sqlite3.connect(path) as connection:
        ids = {row[0] for row in connection.execute("SELECT id FROM forwarded")}
    assert {"first", "batched"} <= ids


async def test_a_compaction_is_new_to_exactly_one_request_across_replicas(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = stores
    here, there = AppliedCompactions(a, 100), AppliedCompactions(b, 100)
    firsts = await asyncio.gather(
        *(forwarded.is_new("c7") for forwarded in (here, there, here, there, here, there))
    )
    assert sum(firsts) == 1
    assert not await AppliedCompactions(a, 100).is_new("c7")  # a restarted process knows it too


async def test_a_redis_checkpoint_left_by_an_older_version_does_not_block_this_ones(
    stores: tuple[RedisStore, RedisStore], redis_server: RedisServer
) -> None:
    a, b = stores
    client = aioredis.from_url(redis_server.url)
    older = orjson.dumps({**_checkpoint(6, "older").to_json(), "version": 0})
    # Where the version before this one kept it (its keys carried no version).
    await client.hset(b"compaction-proxy:cp:" + DIGESTS[5], mapping={"cut": 6, "body": older})
    await client.aclose()
    await a.put(_checkpoint(6, "this version"))
    assert await b.longest(DIGESTS) == _checkpoint(6, "this version")


async def test_a_replica_waits_for_a_held_lease_without_spinning_over_an_unusable_checkpoint(
    stores: tuple[RedisStore, RedisStore], redis_server: RedisServer
) -> None:
    a, b = stores
    key = DIGESTS[5]
    # Stored, but not usable here (cut elsewhere): only the lease tells the wait.
    await a.put(replace(_checkpoint(5), key=key))
    client = aioredis.from_url(redis_server.url)
    lease = await a.acquire(key)
    assert lease is not None

    async def release_later() -> None:
        await asyncio.sleep(0.5)
        await lease.release()

    async def work() -> str:
        return "computed by b"

    async def stored() -> Checkpoint | None:
        return await stored_under(b, DIGESTS, key)

    before = int((await client.info("stats"))["total_commands_processed"])
    result, _ = await asyncio.gather(
        run_once_everywhere(b, key, work, stored, budget_s=10),
        release_later(),
    )
    commands = int((await client.info("stats"))["total_commands_processed"]) - before
    await client.aclose()
    assert result == "computed by b"
    assert commands < 100  # woken by the release notice, not a busy loop of thousands


async def test_work_under_a_redis_lease_fails_with_its_own_exception(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    a, _ = stores

    async def work() -> str:
        raise TimeoutError("the summarizer took too long")

    async def stored() -> Checkpoint | None:
        return None

    with pytest.raises(TimeoutError, match="the summarizer took too long"):
        await run_once_everywhere(a, DIGESTS[5], work, stored, budget_s=10)
    assert await a.acquire(DIGESTS[5]) is not None  # and the lease was released


async def test_a_redis_store_hears_notices_as_soon_as_it_is_open(
    redis_server: RedisServer,
) -> None:
    store = _redis(redis_server.url)
    await store.open()
    client = aioredis.from_url(redis_server.url)
    try:
        subscribers = dict(await client.pubsub_numsub(store.channel))
        assert subscribers[store.channel.encode()] == 1
    finally:
        await client.aclose()
        await store.close()


async def test_a_held_lease_renews_itself_past_its_ttl_until_released(
    redis_server: RedisServer,
) -> None:
    holder, other = _redis(redis_server.url, lease_ttl_s=1.5), _redis(redis_server.url)
    for store in (holder, other):
        await store.open()
    try:
        lease = await holder.acquire(DIGESTS[4])
        assert lease is not None
        await asyncio.sleep(2.0)  # renewed every 0.5 s
        assert await other.acquire(DIGESTS[4]) is None
        await lease.release()
        assert await other.acquire(DIGESTS[4]) is not None
    finally:
        for store in (holder, other):
            await store.close()


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_the_longest_live_checkpoint_is_found_when_a_longer_one_expired_or_went(
    tmp_path: Path, store: str
) -> None:
    # `longest` walks a request's digests from the end and stops at the first live checkpoint:
    # one that expired or was evicted must not hide an earlier one that lives.
    now = [0.0]
    stores: LocalStore | SqliteStore = (
        LocalStore(3, 10.0, timer=lambda: now[0])
        if store == "memory"
        else _sqlite(tmp_path / "state.db", now, max_entries=3, ttl_s=10.0)
    )
    await stores.put(_checkpoint(9))  # expires at 10
    now[0] = 5.0
    await stores.put(_checkpoint(4))  # expires at 15
    found = await stores.longest(DIGESTS)
    assert found is not None and found.cut == 9
    now[0] = 11.0
    found = await stores.longest(DIGESTS)
    assert found is not None and found.cut == 4
    # Evicted rather than expired: the oldest of a full table goes first.
    await stores.put(_checkpoint(11))
    for cut in (2, 3, 6):
        await stores.put(_checkpoint(cut))
    found = await stores.longest(DIGESTS)
    assert found is not None and found.cut == 6
    await stores.close()
