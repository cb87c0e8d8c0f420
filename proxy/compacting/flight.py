"""Single-flight: concurrent callers that need the same result wait for one computation.

The computation runs as a tracked background task, so a caller that gives up (its own timeout,
or its client disconnecting) does not cancel the work the others are waiting for; the result is
still recorded when it lands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

from proxy.tasks import BackgroundTasks

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


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
        for key in keys:
            running = self._running.get(key)
            if running is not None:
                return running
        return None

    def __len__(self) -> int:
        return len(self._running)


async def wait_shielded(task: asyncio.Task[V], timeout_s: float) -> V:
    """Wait for `task` at most `timeout_s` without cancelling it (raises TimeoutError)."""
    return await asyncio.wait_for(asyncio.shield(task), timeout_s)
