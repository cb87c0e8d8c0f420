"""The bound models (thinking bound to its prefix, learned from the "bound to a different
conversation" 400: proxy.compacting.decision.thinking) in the state: a SQLite file across
reopenings and a restart of the proxy, a real Redis shared by two replicas, bounded. A model
learned once is never refused again by a process that shares the state, against the strict
fake of Anthropic's rules (tests/fakes/anthropic_strict.py, platform docs
`build-with-claude/preserved-thinking/fix-bound-to-a-different-conversation`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.compacting.decision.thinking import BoundThinking
from proxy.dialects.anthropic import ANTHROPIC_MESSAGES
from proxy.metrics import StateMetrics
from proxy.settings import ModelsSettings
from proxy.state.local import LocalStore
from proxy.state.redis import RedisStore
from proxy.state.redis_client import RedisClient
from proxy.state.roles import MAX_BOUND_MODELS
from proxy.state.sqlite import SqliteStore
from proxy.state.sqlite_file import StateFile
from proxy.tasks import BackgroundTasks
from tests.fakes.anthropic_strict import StrictAnthropic
from tests.proxy.compacting.conftest import small_window_proxies
from tests.proxy.compacting.test_preserved_thinking import (
    BOUND_MODEL,
    WINDOW,
    proxy_for,
    tool_loop,
)
from tests.proxy.conftest import RunningProxy, StartProxy
from tests.proxy.state.conftest import RedisServer


@pytest.fixture
async def api() -> AsyncIterator[StrictAnthropic]:
    async with StrictAnthropic(window=WINDOW) as fake:
        yield fake


@pytest.fixture
def start(start_proxy: StartProxy, tmp_path: Path) -> Callable[..., Awaitable[RunningProxy]]:
    return small_window_proxies(start_proxy, tmp_path, recall="on")


def _sqlite(path: Path, now: list[float]) -> SqliteStore:
    file = StateFile(path, metrics=StateMetrics(CollectorRegistry()), clock=lambda: now[0])
    return SqliteStore(
        file,
        max_entries=100,
        ttl_s=60.0,
        failure_threshold=3,
        failure_cooldown_s=30.0,
        clock=lambda: now[0],
    )


def _redis(url: str, tasks: BackgroundTasks) -> RedisStore:
    return RedisStore(
        RedisClient(url, timeout_s=1.0, max_connections=4),
        ttl_s=60.0,
        failure_threshold=3,
        failure_cooldown_s=30.0,
        lease_ttl_s=5.0,
        tasks=tasks,
    )


async def test_bound_models_in_the_state_file_outlive_the_store_and_stay_bounded(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    store = _sqlite(tmp_path / "state.sqlite3", now)
    await store.open()
    for n in range(MAX_BOUND_MODELS + 5):
        now[0] += 1
        await store.add_bound_model(f"model-{n}")
    await store.add_bound_model("model-5")  # learned again: the newest
    assert len(await store.bound_models()) == MAX_BOUND_MODELS
    await store.close()
    again = _sqlite(tmp_path / "state.sqlite3", now)
    await again.open()
    kept = await again.bound_models()
    assert len(kept) == MAX_BOUND_MODELS
    assert kept[0] == "model-6" and kept[-1] == "model-5" and "model-4" not in kept
    await again.close()


async def test_bound_models_in_redis_are_shared_by_two_stores_and_stay_bounded(
    redis_server: RedisServer,
) -> None:
    tasks = BackgroundTasks()
    one, other = _redis(redis_server.url, tasks), _redis(redis_server.url, tasks)
    await one.open()
    await other.open()
    try:
        assert await other.bound_models() == []
        await one.add_bound_model("claude-new-6")
        assert await other.bound_models() == ["claude-new-6"]
        for n in range(MAX_BOUND_MODELS + 5):
            await other.add_bound_model(f"model-{n}")
        kept = await one.bound_models()
        assert len(kept) == MAX_BOUND_MODELS and kept[-1] == f"model-{MAX_BOUND_MODELS + 4}"
    finally:
        await one.close()
        await other.close()
        await tasks.close()


async def test_bound_models_in_the_process_stay_bounded() -> None:
    store = LocalStore(10, 60.0)
    for n in range(MAX_BOUND_MODELS + 5):
        await store.add_bound_model(f"model-{n}")
    kept = await store.bound_models()
    assert len(kept) == MAX_BOUND_MODELS and kept[0] == "model-5"


async def test_a_learned_bound_model_is_remembered_in_the_state_file_across_a_restart(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    state = {"backend": "sqlite", "path": str(tmp_path / "state.sqlite3")}
    first = await proxy_for(start, api, preserved_thinking=[], state=state)
    seen = await tool_loop(client, first, BOUND_MODEL, 50, session="before")
    assert [status for status, _ in seen] == [200] * 50
    assert len([r for r in api.refused if r.purpose is None]) == 1  # learned here
    await first.close()
    # A new process on the same file knows the model: its compacted requests strip the stale
    # thinking before any is refused.
    again = await proxy_for(start, api, preserved_thinking=[], state=state)
    refused = len(api.refused)
    seen = await tool_loop(client, again, BOUND_MODEL, 50, session="after")
    assert [status for status, _ in seen] == [200] * 50
    assert any(h.get("x-compaction-status") == "applied" for _, h in seen)
    assert api.refused[refused:] == []


async def test_a_bound_model_learned_on_one_replica_is_known_to_the_other_through_redis(
    start: Callable[..., Awaitable[RunningProxy]],
    api: StrictAnthropic,
    client: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    state = {"backend": "redis", "redis_url": redis_server.url}
    one = await proxy_for(start, api, preserved_thinking=[], state=state)
    other = await proxy_for(start, api, preserved_thinking=[], state=state)
    seen = await tool_loop(client, one, BOUND_MODEL, 50, session="one")
    assert [status for status, _ in seen] == [200] * 50
    assert len([r for r in api.refused if r.purpose is None]) == 1  # learned on `one`
    refused = len(api.refused)
    seen = await tool_loop(client, other, BOUND_MODEL, 50, session="other")
    assert [status for status, _ in seen] == [200] * 50
    assert any(h.get("x-compaction-status") == "applied" for _, h in seen)
    assert api.refused[refused:] == []


async def test_bound_models_learned_elsewhere_are_read_back_at_most_every_refresh() -> None:
    shared = LocalStore(10, 60.0)  # the state another process writes to as well
    now = [0.0]
    thinking = BoundThinking(
        ModelsSettings(preserved_thinking=[]), 8, bound=shared, refresh_s=10.0,
        clock=lambda: now[0],
    )  # fmt: skip
    await thinking.refresh()
    assert not thinking.applies(ANTHROPIC_MESSAGES, "claude-new-6")
    await shared.add_bound_model("claude-new-6")  # learned by another process
    now[0] = 9.0
    await thinking.refresh()
    assert not thinking.applies(ANTHROPIC_MESSAGES, "claude-new-6")
    now[0] = 10.0
    await thinking.refresh()
    assert thinking.applies(ANTHROPIC_MESSAGES, "claude-new-6")
    await thinking.learn("claude-new-7", None, 3)  # learned here: written to the state
    assert list(await shared.bound_models()) == ["claude-new-6", "claude-new-7"]
