"""A Redis that is full, stalls or is misconfigured: requests still go through, compaction still
happens, and the trouble shows in /metrics and in one clear line; an invalid URL stops the start;
the connection pool is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
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
from tests.proxy.test_settings import run_cli

PASSWORD = "s3cret-pass"


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


@pytest.mark.parametrize(
    ("path", "said"),
    [
        (f":wrong-{PASSWORD}@{{host}}/0", "refused the login (state.redis_url)"),
        (f":{PASSWORD}@{{host}}/99", "has no database 99"),
        (f":{PASSWORD}@127.0.0.1:{{closed}}/0", "cannot be reached"),
    ],
    ids=["wrong-password", "missing-database", "nothing-listening"],
)
async def test_a_misconfigured_redis_is_one_clear_line_at_start_and_requests_still_compact(
    path: str, said: str, spawn: SpawnProxy, script: Script, client: Any, tmp_path: Path
) -> None:
    server = RedisServer(redis_binary(), free_port(), "--requirepass", PASSWORD)
    await server.start()
    try:
        host = f"127.0.0.1:{server.port}"
        url = "redis://" + path.format(host=host, closed=free_port())
        proxy = await spawn(state={"backend": "redis", "redis_url": url})
        lines = _warnings(tmp_path / "proxy.log")
        assert len(lines) == 1, lines  # before any request: at start
        assert said in lines[0]
        messages = conversation_of(int(WINDOW * 1.1))
        first = await post(client, proxy, messages)
        assert first.status == 200
        assert first.headers["x-compaction-status"] == "applied"  # in-process, degraded
        again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
        assert again.headers["x-compaction-status"] == "reused"
        assert await proxy.metric(client, "compaction_proxy_state_degraded") == 1
        assert len(_warnings(tmp_path / "proxy.log")) == 1
        assert PASSWORD not in (tmp_path / "proxy.log").read_text()
    finally:
        await server.stop()


def _warnings(log: Path) -> list[str]:
    """The state backend's warnings in a proxy's log, each as its JSON line."""
    return [
        line
        for line in log.read_text().splitlines()
        if line.startswith("{") and "state backend" in json.loads(line)["msg"]
    ]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/abc", "redis://127.0.0.1:6379/0?db=x"])
def test_an_invalid_redis_url_stops_the_start_with_one_line_naming_the_key(
    url: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"state": {"backend": "redis", "redis_url": url}}))
    result = run_cli("--config", str(config), "--port", str(free_port()), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "state.redis_url: the database must be a number" in lines[0]


async def test_the_redis_connections_of_a_process_are_bounded(redis_server: RedisServer) -> None:
    store = _redis(redis_server.url, max_connections=4)
    await store.open()
    probe = aioredis.from_url(redis_server.url)
    try:
        answers = await asyncio.gather(*(store.is_cooling(f"model-{i}") for i in range(200)))
        assert answers == [False] * 200
        clients = int((await probe.info("clients"))["connected_clients"])
        assert clients - 1 <= 4  # the probe aside; the notices' subscription among the four
    finally:
        await probe.aclose()
        await store.close()
