"""The archive in Redis never crowds out checkpoints: at `maxmemory 64mb` (`volatile-lru`, where
archive keys and checkpoints both expire and so both could be evicted), 400 sessions each
archiving more than Redis could hold in all keep every checkpoint, nothing is evicted, no key of
a dropped archive is left behind, and recall still answers for the newest sessions."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from compaction.checkpoints import Checkpoint, conversation_seed, prefix_digests
from compaction.marker import SUMMARY_MARKER
from proxy.metrics import StateMetrics
from proxy.settings import ArchiveSettings, CompactionSection, StateSettings
from proxy.state.archive import Entry, Scope
from proxy.state.archive.redis import RedisArchive
from proxy.state.factory import build_state
from proxy.state.redis import RedisStore
from proxy.state.redis_client import RedisClient
from proxy.tasks import BackgroundTasks
from tests import factories as f
from tests.proxy.state.archive.conftest import entry
from tests.proxy.state.conftest import RedisServer, free_port, redis_binary

SESSIONS = 400
PREFIX = "compaction-proxy:archive:"


@pytest.fixture
async def small_redis() -> AsyncIterator[RedisServer]:
    server = RedisServer(
        redis_binary(), free_port(), "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"
    )
    await server.start()
    yield server
    await server.stop()


def _digests(number: int) -> list[bytes]:
    messages = [f.system(), *(f.user(f"session {number} question {i}") for i in range(4))]
    return prefix_digests(messages, conversation_seed(f"session-{number}"))


def _checkpoint(number: int) -> Checkpoint:
    # About the size of a real one: a summary of ~2,000 tokens.
    text = f"{SUMMARY_MARKER}\nsession {number}: " + "goals, decisions, facts. " * 320
    return Checkpoint(_digests(number)[-1], 5, 1, (), {"role": "user", "content": text},
                      f"c{number}", "llm")  # fmt: skip


def _templates(at: float) -> list[list[list[Entry]]]:
    """Sessions' folded turns, built once (the test is about Redis, not about building turns):
    prose, and a long identifier that compresses about in half (a hash, a blob's id), so that
    400 sessions archive over 100 MB."""
    rng = random.Random(7)
    templates = []
    for template in range(10):
        batches = []
        for compaction in range(4):
            batch = []
            for turn in range(40):
                index = compaction * 40 + turn
                words = " ".join(f"word{rng.randrange(3000)}" for _ in range(30))
                text = f"turn{index} template{template} {words} {rng.randbytes(1500).hex()}"
                batch.append(Entry.of(index, "chat", "message", f"c{compaction}", at, "{}", text))
            batches.append(batch)
        templates.append(batches)
    return templates


def _session(number: int, templates: list[list[list[Entry]]]) -> list[list[Entry]]:
    """A session's folded turns: a template's, its first turn naming the session."""
    batches = [list(batch) for batch in templates[number % len(templates)]]
    first = batches[0][0]
    text = f"session{number} opening words {first.text}"
    batches[0][0] = Entry.of(first.index, "chat", "message", f"c{number}", first.at, "{}", text)
    return batches


async def test_at_maxmemory_64mb_400_sessions_keep_every_checkpoint_and_recall_the_newest(
    small_redis: RedisServer,
) -> None:
    tasks = BackgroundTasks()
    settings = StateSettings(backend="redis", redis_url=small_redis.url, timeout_s=5)
    state = build_state(
        settings, CompactionSection(), ArchiveSettings(), StateMetrics(CollectorRegistry()), tasks
    )
    await state.open()
    templates = _templates(time.time())
    dropped = 0
    for number in range(SESSIONS):
        await state.backend.put(_checkpoint(number))
        for batch in _session(number, templates):
            dropped += (await state.archive.add(Scope(f"s{number}", "aa" * 16), batch))["total"]
    assert dropped > 0  # the archive written is more than Redis could hold

    client = RedisClient(small_redis.url, timeout_s=5, max_connections=4)
    redis = client.get()
    assert (await redis.info("stats"))["evicted_keys"] == 0
    assert (await redis.info("memory"))["used_memory"] < 64 * 2**20
    # Every checkpoint, read by a store of its own (no cache in front of Redis).
    reader = RedisStore(client, ttl_s=21600, failure_threshold=3, failure_cooldown_s=30,
                        lease_ttl_s=10, tasks=tasks)  # fmt: skip
    await reader.open()
    for number in range(SESSIONS):
        assert await reader.longest(_digests(number)) == _checkpoint(number), number
    for number in range(SESSIONS - 10, SESSIONS):
        found = await state.archive.search(
            f"s{number}", f"session{number} opening", tenant="aa" * 16, limit=1
        )
        assert [item.index for item in found] == [0], number
    assert await state.archive.search("s0", "session0 opening", tenant=None, limit=1) == []
    # No orphan: every archive key belongs to a scope still listed, and the sums agree.
    scopes = {member.decode() for member in await redis.zrange(f"{PREFIX}scopes", 0, -1)}
    assert 0 < len(scopes) < SESSIONS
    weights = await redis.hgetall(f"{PREFIX}weights")
    assert {member.decode() for member in weights} == scopes
    assert sum(int(value) for value in weights.values()) == int(await redis.get(f"{PREFIX}total"))
    digests = {
        state.archive._key(member.partition("\x00")[2], member.partition("\x00")[0])  # type: ignore[attr-defined]
        for member in scopes
    }
    sessions = {f"{PREFIX}session:{member.partition(chr(0))[2]}" for member in scopes}
    globals_ = {f"{PREFIX}scopes", f"{PREFIX}weights", f"{PREFIX}total"}
    async for raw in redis.scan_iter(match=f"{PREFIX}*", count=1000):
        key = raw.decode()
        assert key in globals_ or key in sessions or key.rpartition(":")[0] in digests, key
    await reader.close()
    await state.close()
    await tasks.close()


async def test_two_replicas_archiving_one_fold_at_once_count_its_weight_once(
    small_redis: RedisServer,
) -> None:
    # The weights bound what is kept: counted twice, a scope's turns would push themselves out.
    clients = [RedisClient(small_redis.url, timeout_s=2, max_connections=4) for _ in range(3)]
    replicas = [RedisArchive(client, max_bytes=1 << 20, max_age_s=86400) for client in clients[:2]]
    for replica in replicas:
        await replica.open()
    try:
        now = time.time()
        folds = [
            [entry(i, f"fold {fold} turn {i} " + "words " * 80, at=now) for i in range(8)]
            for fold in range(20)
        ]
        for number, turns in enumerate(folds):
            scope = Scope(f"agent-{number}", "aa" * 16)
            await asyncio.gather(*(replica.add(scope, turns) for replica in replicas))
        redis = clients[2].get()
        weights = await redis.hgetall(f"{PREFIX}weights")
        expected = sorted(sum(replicas[0].weight(turn) for turn in fold) for fold in folds)
        assert sorted(int(weight) for weight in weights.values()) == expected
        assert int(await redis.get(f"{PREFIX}total")) == sum(expected)
    finally:
        for replica in replicas:
            await replica.close()
        for client in clients:
            await client.close()
