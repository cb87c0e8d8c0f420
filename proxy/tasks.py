"""Background work: every task the proxy starts on its own goes through here.

The set keeps a strong reference to each running task (asyncio keeps only weak ones) and
`close()` cancels what is left at shutdown, so nothing runs after the app is gone. A task that
fails is logged once, here, unless its failure was logged where it was found (`Reported`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class Reported(Exception):
    """A failure logged and counted where it was found (e.g. a lost worker process): a task
    that ends with it is not logged again, however many tasks it took down."""


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self._lifelong: set[asyncio.Task[object]] = set()
        self._closed = False

    def spawn(
        self, coro: Coroutine[object, None, T], *, name: str, lifelong: bool = False
    ) -> asyncio.Task[T]:
        """`lifelong`: runs for the app's whole life (a watcher), not work that waits."""
        if self._closed:
            coro.close()
            raise RuntimeError("background tasks are closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        if lifelong:
            self._lifelong.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        self._lifelong.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, Reported):
            log.warning(
                "background task failed",
                extra={"task": task.get_name(), "error": repr(error)},
            )

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def queued(self) -> int:
        """The tasks that are work waiting to be done: all but the lifelong ones."""
        return len(self._tasks) - len(self._lifelong)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
