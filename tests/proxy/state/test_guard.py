"""The guard in front of a persistent or shared backend: a backend that is down or slow is
answered from the in-process cache, logged once per outage, counted, and written back to once it
answers again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from compaction.checkpoints import Checkpoint
from proxy.metrics import StateMetrics
from proxy.state.guard import Guarded
from proxy.state.local import LocalStore
from proxy.state.roles import Lease
from proxy.tasks import BackgroundTasks
from tests.proxy.state.test_stores import DIGESTS, _checkpoint


class Flaky(LocalStore):
    """A backend that can be down (refusing every call) or slow (answering after `delay_s`)."""

    name = "flaky"

    def __init__(self) -> None:
        super().__init__(100, 60)
        self.down = False
        self.delay_s = 0.0
        self.writable = asyncio.Event()  # cleared: writes wait (a backend slow to write)
        self.writable.set()
        self.writing = 0

    async def _gate(self) -> None:
        if self.down:
            raise ConnectionError("backend down")
        await asyncio.sleep(self.delay_s)

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        await self._gate()
        return await super().longest(digests)

    async def put(self, checkpoint: Checkpoint) -> None:
        await self._gate()
        self.writing += 1
        await self.writable.wait()
        await super().put(checkpoint)

    async def acquire(self, key: bytes) -> Lease | None:
        await self._gate()
        return None  # held elsewhere, while the backend answers


def _guarded(
    backend: Flaky, now: list[float], tasks: BackgroundTasks | None = None, timeout_s: float = 0.05
) -> tuple[Guarded, CollectorRegistry]:
    registry = CollectorRegistry()
    guard = Guarded(
        backend,
        LocalStore(100, 60),
        StateMetrics(registry),
        BackgroundTasks() if tasks is None else tasks,
        timeout_s=timeout_s,
        retry_s=5,
        clock=lambda: now[0],
    )
    return guard, registry


async def _eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait (a bounded while) until background work made `check` true."""
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


def _sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name, {"backend": "flaky"}) or 0.0


async def test_a_backend_that_is_down_is_served_in_process_logged_once_and_caught_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    backend = Flaky()
    guard, registry = _guarded(backend, now)
    await guard.put(_checkpoint(3))
    backend.down = True
    with caplog.at_level(logging.WARNING):
        await guard.put(_checkpoint(6))
        assert await guard.longest(DIGESTS) == _checkpoint(6)
        assert await guard.acquire(DIGESTS[5]) is not None  # this process computes on its own
        now[0] = 6
        assert await guard.longest(DIGESTS) == _checkpoint(6)
    assert caplog.text.count("state backend unavailable") == 1
    assert _sample(registry, "compaction_proxy_state_outages_total") == 1
    assert _sample(registry, "compaction_proxy_state_degraded") == 1
    assert (
        registry.get_sample_value(
            "compaction_proxy_state_errors_total", {"backend": "flaky", "operation": "write"}
        )
        == 1
    )

    backend.down = False
    now[0] = 12
    assert await guard.longest(DIGESTS[:5]) == _checkpoint(3)
    assert _sample(registry, "compaction_proxy_state_degraded") == 0

    async def written_back() -> bool:
        return await backend.longest(DIGESTS) == _checkpoint(6)

    await _eventually(written_back)
    assert await guard.acquire(DIGESTS[5]) is None  # the backend's answer again


async def test_a_slow_backend_is_answered_from_the_cache_within_the_timeout() -> None:
    now = [0.0]
    backend = Flaky()
    guard, registry = _guarded(backend, now)
    await guard.put(_checkpoint(4))
    backend.delay_s = 5.0
    found = await asyncio.wait_for(guard.longest(DIGESTS), 1.0)
    assert found == _checkpoint(4)
    assert _sample(registry, "compaction_proxy_state_degraded") == 1


async def test_the_first_read_after_an_outage_returns_the_checkpoint_written_during_it() -> None:
    now = [0.0]
    backend = Flaky()
    guard, _ = _guarded(backend, now)
    await guard.put(_checkpoint(3))
    backend.down = True
    await guard.put(_checkpoint(6))  # only in the process while the backend is down
    backend.down = False
    now[0] = 12
    assert await guard.longest(DIGESTS) == _checkpoint(6)


async def test_writing_back_after_an_outage_runs_in_the_background_in_batches() -> None:
    now = [0.0]
    backend = Flaky()
    tasks = BackgroundTasks()
    guard, registry = _guarded(backend, now, tasks, timeout_s=5.0)
    backend.down = True
    for cut in range(2, 8):
        await guard.put(_checkpoint(cut))
    backend.down = False
    backend.writable.clear()  # the backend is back but slow to write
    now[0] = 12
    # The request that finds the backend back does not wait for the catching up.
    assert await asyncio.wait_for(guard.longest(DIGESTS), 1.0) == _checkpoint(7)

    async def all_writing() -> bool:
        return backend.writing == 6  # at once, not one after the other

    await _eventually(all_writing)
    backend.writable.set()

    async def all_written() -> bool:
        found = [await backend.longest(DIGESTS[:cut]) for cut in range(2, 8)]
        return found == [_checkpoint(cut) for cut in range(2, 8)]

    await _eventually(all_written)
    assert _sample(registry, "compaction_proxy_state_degraded") == 0
    await tasks.close()
