"""Single-flight: concurrent callers that need the same result wait for one computation.

The computation runs as a tracked background task, so a caller that gives up (its own timeout,
or its client disconnecting) does not cancel the work the others are waiting for; the result is
still recorded when it lands. Across processes sharing a state backend, `run_once_everywhere`
holds the backend's lease for the key while computing, and a process that finds the lease taken
waits for the holder and takes the stored result instead of computing it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from proxy.state.roles import Leases
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
S = TypeVar("S")


class SingleFlight(Generic[K, V]):
    def __init__(self, tasks: BackgroundTasks) -> None:
        self._tasks = tasks
        self._running: dict[K, asyncio.Task[V]] = {}

    def start(self, key: K, work: Callable[[], Awaitable[V]], *, name: str) -> asyncio.Task[V]:
        """The task computing `key`: the one already running, or a new one running `work`."""
        running = self._running.get(key)
        if running is not None:
            return running

        async def run() -> V:
            try:
                return await work()
            finally:
                self._running.pop(key, None)

        task = self._tasks.spawn(run(), name=name)
        self._running[key] = task
        return task

    def find(self, keys: Iterable[K]) -> asyncio.Task[V] | None:
        """The first running task among `keys`, in the order given."""
        if not self._running:  # the usual case; `keys` may be a long history's digests
            return None
        for key in keys:
            running = self._running.get(key)
            if running is not None:
                return running
        return None

    def __contains__(self, key: object) -> bool:
        return key in self._running

    def __len__(self) -> int:
        return len(self._running)


async def wait_shielded(task: asyncio.Task[V], timeout_s: float) -> V:
    """Wait for `task` at most `timeout_s` without cancelling it (raises TimeoutError)."""
    return await asyncio.wait_for(asyncio.shield(task), timeout_s)


async def is_running(flight: SingleFlight[bytes, V], leases: Leases, keys: Sequence[bytes]) -> bool:
    """True while a computation of any of `keys` runs, here or in another process."""
    return flight.find(keys) is not None or await leases.holder(keys) is not None


async def wait_for_running(
    flight: SingleFlight[bytes, V],
    leases: Leases,
    keys: Sequence[bytes],
    timeout_s: float,
    *,
    starting: SingleFlight[bytes, S] | None = None,
) -> bool:
    """Wait (at most `timeout_s`) for a computation of any of `keys` under way, in this process
    or, through `leases`, in another; False when none is. One that failed or timed out is left
    to the caller (it was logged where it ran). Work still `starting` under any of `keys` (it
    learns its own key as it starts, then runs in `flight`) is waited for first."""
    deadline = time.monotonic() + timeout_s
    before = starting.find(reversed(keys)) if starting is not None else None
    if before is not None:
        with contextlib.suppress(Exception):
            await wait_shielded(before, timeout_s)
        timeout_s = max(0.0, deadline - time.monotonic())
    pending = flight.find(reversed(keys))
    if pending is not None:
        with contextlib.suppress(Exception):
            await wait_shielded(pending, timeout_s)
        return True
    held = await leases.holder(keys)
    if held is None:
        return before is not None
    await leases.wait(held, timeout_s)
    return True


async def run_once_everywhere(
    leases: Leases,
    key: bytes,
    work: Callable[[], Awaitable[V]],
    stored: Callable[[], Awaitable[S | None]],
    budget_s: float,
) -> V | S:
    """`work()` under the lease for `key`, unless a result is stored meanwhile; while
    another process holds the lease, wait for it (at most `budget_s` in all) and return what it
    stored. A holder that let go without storing anything (it failed, or died and its lease
    expired) leaves the work to this process. Raises TimeoutError past the budget; the work's
    own exceptions reach the caller as raised."""
    deadline = time.monotonic() + budget_s
    while True:
        lease = await leases.acquire(key)
        if lease is not None:
            try:
                found = await stored()  # finished elsewhere just before we got the lease
                if found is not None:
                    return found
                return await work()  # the lease renews itself meanwhile
            finally:
                with contextlib.suppress(Exception):  # an expired lease frees itself
                    await lease.release()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"lease of {key.hex()} still held elsewhere")
        await leases.wait(key, remaining)
        found = await stored()
        if found is not None:
            return found
