"""The processes a compaction's CPU work runs in, so the event loop keeps moving bytes meanwhile.

A `compaction.Offload` over a `ProcessPoolExecutor` of `compaction.workers` processes (0: inline,
on the loop). Workers are started with "spawn" (never forked from a process with a running loop
and threads) on the first job and stopped with the app.

Every job has a deadline (`compaction.worker_timeout_s`) that runs from when a worker takes it:
the pool is handed at most one job per worker, the others wait their turn here, so no job spends
its deadline queued behind another. A pool whose worker misses a deadline (stuck, stopped,
looping) has its processes killed and is replaced; so is a pool broken by a worker that died.
Either way that is one warning and one count (`compaction_proxy_worker_replacements_total`), and
each job the old pool held raises `WorkerLost`, which its caller takes as a failed compaction
without logging it again. Jobs still waiting their turn go to the new pool. How long a request
waits for a job is its own deadline's business (proxy.compacting.decision.conversations).

A worker ends with the process that started it, however that one ended: a proxy killed outright
never shuts its pool down, and its workers, waiting for jobs, would otherwise live on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from typing import TypeVar

from prometheus_client import Counter

from compaction import OffloadLost, worker_mentions
from proxy.tasks import Reported

Job = TypeVar("Job")
Result = TypeVar("Result")

log = logging.getLogger(__name__)


class WorkerLost(Reported, OffloadLost):
    """The worker process running a job was lost: it died, or it missed the job's deadline and
    was killed. Logged and counted once, by the `Workers` that found it (a background task
    that ends with it, a precompute or a summarization, is not logged again)."""


class Workers:
    def __init__(
        self,
        processes: int,
        *,
        timeout_s: float = 60.0,
        replacements: Counter | None = None,
        scanned_chars: int | None = None,
    ) -> None:
        """`timeout_s`: the deadline of one job in a worker; `replacements`: counts each pool
        replaced, by reason (`deadline`, `died`); `scanned_chars`: the characters of text each
        worker keeps scanned for facts (compaction.stages.worker_mentions; None: its own
        default)."""
        self._processes = processes
        self._scanned_chars = scanned_chars
        self._timeout_s = timeout_s
        self._replacements = replacements
        self._pool: _Pool | None = None
        # One job per worker in the pool at a time: a turn is given back when the job ends, not
        # when its caller stops waiting (a job given up on still occupies its worker).
        self._turns = asyncio.Semaphore(max(1, processes))

    @property
    def processes(self) -> int:
        return self._processes

    @property
    def crossing(self) -> bool:
        """Whether jobs leave this process (with no workers they run inline, as they are)."""
        return self._processes > 0

    @property
    def pids(self) -> tuple[int, ...]:
        """The process ids of the workers running now (none before the first job)."""
        return self._pool.pids if self._pool is not None else ()

    @property
    def started(self) -> bool:
        """Whether every worker process there is has started (spawned, imported): until then a
        job's deadline waits for its worker to start."""
        return self._pool is not None and not self._pool.starting

    def open(self) -> None:
        """Processes start on the first job (an app that never compacts starts none)."""
        if self._processes > 0:
            self._pool = _Pool.start(self._processes, self._scanned_chars)

    async def close(self) -> None:
        """Stop the workers, off the loop: a job under way may finish within its deadline, then
        whatever is still alive (a stopped or stuck worker) is killed."""
        pool, self._pool = self._pool, None
        if pool is not None:
            processes = pool.stop()
            end = functools.partial(_end, processes, self._timeout_s)
            await asyncio.get_running_loop().run_in_executor(None, end)

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        """`fn(job)` in a worker; raises `WorkerLost` if the worker is lost meanwhile."""
        if self._pool is None:
            return fn(job)
        await self._turns.acquire()
        pool = self._pool
        if pool is None:  # stopped while this job waited its turn
            self._turns.release()
            return fn(job)
        try:
            done = pool.executor.submit(fn, job)
        except BrokenProcessPool as exc:  # a worker died between two jobs
            self._turns.release()
            self._replace(pool, "died")
            raise WorkerLost("a worker process died") from exc
        self._watch(pool, done)
        try:
            return await asyncio.wrap_future(done)
        except BrokenProcessPool as exc:
            self._replace(pool, "died")
            raise WorkerLost("the worker process running this job was lost") from exc

    def _watch(self, pool: _Pool, done: Future[Result]) -> None:
        """Replace `pool` if `done` is not done by its deadline; give the turn back when it is."""
        loop = asyncio.get_running_loop()
        since = loop.time()

        def check() -> None:
            if done.done():
                return
            if pool.starting and loop.time() - since < _START_S:
                # Spawning and importing is no part of the job: its deadline runs once started.
                timer[0] = loop.call_later(self._timeout_s, check)
                return
            self._replace(pool, "deadline")

        timer = [loop.call_later(self._timeout_s, check)]

        def finished() -> None:
            timer[0].cancel()
            self._turns.release()

        def on_done(_: Future[Result]) -> None:  # in the pool's thread, or on the loop
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to give back
                loop.call_soon_threadsafe(finished)

        done.add_done_callback(on_done)

    def _replace(self, pool: _Pool, reason: str) -> None:
        """Kill `pool`'s processes and start afresh, once per pool: the first job to find it
        broken or overdue says so, the others it took down with it stay quiet."""
        if self._pool is not pool:
            return
        pids = ", ".join(str(pid) for pid in pool.pids)
        for process in pool.stop():
            process.kill()  # works on a stopped process too, where terminate would wait
        # Its jobs fail as the old pool notices its dead workers (BrokenProcessPool).
        self._pool = _Pool.start(self._processes, self._scanned_chars)
        if reason == "deadline":
            why = f"missed a job's {self._timeout_s:g} s deadline and was killed"
        else:
            why = "died"
        log.warning(
            "a compaction worker process %s: the pool's processes are killed, their jobs fall "
            "back, and a new pool takes the next ones",
            why,
            extra={"reason": reason, "pids": pids},
        )
        if self._replacements is not None:
            self._replacements.labels(reason).inc()


_START_S = 60.0
"""How long a worker may take to start (spawn, imports) before the deadline of the job it is
to run starts counting anyway (a worker stuck while starting is replaced too)."""


@dataclass(frozen=True)
class _Pool:
    executor: ProcessPoolExecutor
    ready: Synchronized[int]
    """How many of its workers have started."""

    @classmethod
    def start(cls, processes: int, scanned_chars: int | None) -> _Pool:
        """A pool of `processes` workers, each started on a job that finds none free."""
        spawn = multiprocessing.get_context("spawn")
        ready = spawn.Value("i", 0)
        executor = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=spawn,
            initializer=_start_worker,
            initargs=(ready, scanned_chars),
        )
        return cls(executor, ready)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(self.executor._processes or ())

    @property
    def starting(self) -> bool:
        return self.ready.value < len(self.executor._processes or ())

    def stop(self) -> Sequence[BaseProcess]:
        """Stop taking jobs (idle workers exit); its processes, to wait for or kill."""
        processes = list((self.executor._processes or {}).values())
        self.executor.shutdown(wait=False, cancel_futures=True)
        return processes


def _end(processes: Sequence[BaseProcess], grace_s: float) -> None:
    """Wait up to `grace_s` in all for `processes` to exit, then kill the rest."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.exitcode is None:
            process.kill()
            process.join()


def _start_worker(ready: Synchronized[int], scanned_chars: int | None) -> None:
    """In a worker, at its start: bound its scanned texts, say it started, and start a thread
    that ends the process once its parent is gone (the parent's sentinel, a pipe the parent
    holds open, reads as closed then)."""
    if scanned_chars is not None:
        worker_mentions().max_chars = scanned_chars
    parent = multiprocessing.parent_process()
    if parent is not None:
        watch = threading.Thread(target=_wait_then_exit, args=(parent.sentinel,), daemon=True)
        watch.start()
    with ready.get_lock():
        ready.value += 1


def _wait_then_exit(sentinel: int) -> None:
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
