"""The processes a compaction's CPU work runs in, so the event loop keeps moving bytes meanwhile.

A `compaction.Offload` over a `ProcessPoolExecutor` of `compaction.workers` processes (0: inline,
on the loop). Workers are started with "spawn" (never forked from a process with a running loop
and threads) on the first job and stopped with the app; a pool broken by a dying worker is replaced
for the next job (the job that saw it fails, and its compaction falls back like any other error).
A worker ends with the process that started it, however that one ended: a proxy killed outright
never shuts its pool down, and its workers, waiting for jobs, would otherwise live on.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


class Workers:
    def __init__(self, processes: int) -> None:
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None

    @property
    def processes(self) -> int:
        return self._processes

    @property
    def crossing(self) -> bool:
        """Whether jobs leave this process (with no workers they run inline, as they are)."""
        return self._processes > 0

    def open(self) -> None:
        """Processes start on the first job (an app that never compacts starts none)."""
        if self._processes > 0:
            self._pool = self._new_pool()

    async def close(self) -> None:
        """Stop the workers (a job under way finishes first), off the loop."""
        pool, self._pool = self._pool, None
        if pool is not None:
            stop = functools.partial(pool.shutdown, wait=True, cancel_futures=True)
            await asyncio.get_running_loop().run_in_executor(None, stop)

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        pool = self._pool
        if pool is None:
            return fn(job)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, job)
        except BrokenProcessPool:
            if self._pool is pool:
                pool.shutdown(wait=False, cancel_futures=True)
                self._pool = self._new_pool()
            raise

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self._processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_exit_with_parent,
        )


def _exit_with_parent() -> None:
    """In a worker, at its start: a thread that ends the process once its parent is gone (the
    parent's sentinel, a pipe the parent holds open, reads as closed then)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        watch = threading.Thread(target=_wait_then_exit, args=(parent.sentinel,), daemon=True)
        watch.start()


def _wait_then_exit(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
