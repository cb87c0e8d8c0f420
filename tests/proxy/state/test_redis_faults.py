"""A Redis that is full or stalls: requests still go through, compaction still happens, and the
trouble shows in /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml

from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post
from tests.proxy.state.conftest import (
    REPO,
    RedisServer,
    SpawnProxy,
    free_port,
    redis_binary,
)
from tests.proxy.state.test_stores import DIGESTS, _redis


@pytest.fixture
async def full_redis() -> AsyncIterator[RedisServer]:
    """A Redis at its memory limit that refuses every write."""
    server = RedisServer(
        redis_binary(), free_port(), "--maxmemory", "2mb", "--maxmemory-policy", "noeviction"
    )
    await server.start()
    client = aioredis.from_url(server.url)
    with contextlib.suppress(aioredis.ResponseError):  # OOM: full
        for i in range(10_000):
            await client.set(f"filler:{i}", b"x" * 4096)
    await client.aclose()
    yield server
    await server.stop()


async def test_a_full_redis_fails_no_request(
    spawn: SpawnProxy, full_redis: RedisServer, script: Script, client: Any
) -> None:
    proxy = await spawn(state={"backend": "redis", "redis_url": full_redis.url})
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, proxy, messages)
    assert first.status == 200
    assert first.headers["x-compaction-status"] == "applied"
    again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    assert again.headers["x-compaction-status"] == "reused"
    assert await proxy.metric(client, "compaction_proxy_state_errors_total") >= 1
    assert len(script.calls("summary")) == 1


async def test_a_stalled_redis_costs_a_request_at_most_the_state_timeout(
    spawn: SpawnProxy, script: Script, client: Any
) -> None:
    server = RedisServer(redis_binary(), free_port(), "--enable-debug-command", "local")
    await server.start()
    try:
        state = {"backend": "redis", "redis_url": server.url, "timeout_s": 0.2}
        proxy = await spawn(state=state)
        messages = conversation_of(int(WINDOW * 1.1))
        assert (await post(client, proxy, messages)).headers["x-compaction-status"] == "applied"
        stall = aioredis.from_url(server.url, socket_timeout=30)
        stalled = asyncio.ensure_future(stall.execute_command("DEBUG", "SLEEP", "5"))
        await _until_stalled(server)
        started = time.monotonic()
        again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
        elapsed = time.monotonic() - started
        assert again.status == 200
        assert again.headers["x-compaction-status"] == "reused"  # from the in-process cache
        assert elapsed < 2.5  # one state timeout (0.2 s), not the 5 s stall
        assert await proxy.metric(client, "compaction_proxy_state_degraded") == 1
        await stalled
        await stall.aclose()
    finally:
        await server.stop()


async def _until_stalled(server: RedisServer) -> None:
    """Return once Redis stopped answering (the DEBUG SLEEP is in effect), not just sent."""
    for _ in range(100):
        probe = aioredis.from_url(server.url, socket_timeout=0.05)
        try:
            await probe.ping()
        except aioredis.TimeoutError:
            return
        finally:
            await probe.aclose()
        await asyncio.sleep(0.01)
    raise AssertionError("redis never stalled")


def _compose_redis_policy() -> str:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    command: list[str] = compose["services"]["redis"]["command"]
    return command[command.index("--maxmemory-policy") + 1]


async def test_the_compose_redis_evicts_idle_checkpoints_before_a_held_lease() -> None:
    server = RedisServer(
        redis_binary(), free_port(), "--maxmemory", "2mb",
        "--maxmemory-policy", _compose_redis_policy(),
    )  # fmt: skip
    await server.start()
    store = _redis(server.url, lease_ttl_s=10)
    await store.open()
    client = aioredis.from_url(server.url)
    try:
        # Checkpoints (long TTL) up to the memory limit, then idle for a while: Redis tracks
        # idle time by the second.
        for i in range(10_000):
            await client.set(f"compaction-proxy:cp:v1:{i}", b"x" * 4096, px=3_600_000)
            if int((await client.info("stats"))["evicted_keys"]) > 0:
                break
        await asyncio.sleep(1.1)
        lease = await store.acquire(DIGESTS[5])
        assert lease is not None
        for i in range(100):  # a replica keeps writing while the lease is held
            await client.set(f"compaction-proxy:cp:v1:new{i}", b"x" * 4096, px=3_600_000)
        assert await lease.renew()  # still held: not evicted for having the shortest TTL
    finally:
        await client.aclose()
        await store.close()
        await server.stop()
