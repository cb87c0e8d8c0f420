"""A persistent or shared backend that never fails a request.

Every call to the backend is bounded by `state.timeout_s`. A call that fails or times out is
answered from the in-process cache (a LocalStore holding every checkpoint this process wrote or
read), counted in /metrics, and the backend is left alone for `state.retry_s`; the first failure
of an outage is logged, and so is the recovery. Checkpoints written while the backend was down
are written to it once it answers again, in the background (never inside the request that
happened to find the backend back), a batch at a time, and so are the forwarded marks made
meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from compaction import Checkpoint
from proxy.metrics import StateMetrics
from proxy.state.local import LocalStore
from proxy.state.roles import Lease, LocalLease, StateBackend
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

T = TypeVar("T")
# Checkpoints kept for writing back after an outage; beyond, the oldest are only in-process.
_MAX_UNSYNCED = 1000
# Written back concurrently, so catching up costs a few round trips, not one per checkpoint.
_WRITE_BACK_BATCH = 32


class Guarded:
    def __init__(
        self,
        backend: StateBackend,
        local: LocalStore,
        metrics: StateMetrics,
        tasks: BackgroundTasks,
        *,
        timeout_s: float,
        retry_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = backend.name
        self.backend = backend
        self._local = local
        self._metrics = metrics
        self._tasks = tasks
        self._writing_back: asyncio.Task[None] | None = None
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._clock = clock
        self._down_until: float | None = None
        self._unsynced: dict[bytes, Checkpoint] = {}
        self._unsynced_marks: dict[str, None] = {}  # compaction ids, oldest first
        metrics.degraded.labels(backend=self.name).set(0)

    @property
    def degraded(self) -> bool:
        return self._down_until is not None

    async def open(self) -> None:
        await self._call("open", self.backend.open, lambda: None)

    async def close(self) -> None:
        try:
            await self.backend.close()
        except Exception as exc:  # shutting down: nothing left to protect
            log.warning("state backend did not close cleanly", extra={"error": repr(exc)})

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        found = await self._call("read", lambda: self.backend.longest(digests), lambda: None)
        # The process may know a longer one: written while the backend was down, and not yet
        # written back to it.
        local = await self._local.longest(digests)
        if found is None or (local is not None and local.cut > found.cut):
            return local
        self._local.remember(found)
        return found

    async def put(self, checkpoint: Checkpoint) -> None:
        await self._local.put(checkpoint)
        if not await self._call("write", lambda: _true(self.backend.put(checkpoint)), _false):
            self._unsynced[checkpoint.key] = checkpoint
            while len(self._unsynced) > _MAX_UNSYNCED:
                del self._unsynced[next(iter(self._unsynced))]

    async def is_cooling(self, key: str) -> bool:
        local = await self._local.is_cooling(key)
        return local or await self._call("cooldown", lambda: self.backend.is_cooling(key), _false)

    async def record_outcome(self, key: str, *, ok: bool) -> None:
        await self._local.record_outcome(key, ok=ok)
        await self._call("cooldown", lambda: self.backend.record_outcome(key, ok=ok), lambda: None)

    async def acquire(self, key: bytes) -> Lease | None:
        # Down: this process computes on its own; single-flight still holds inside it.
        return await self._call("lease", lambda: self.backend.acquire(key), LocalLease)

    async def holder(self, digests: Sequence[bytes]) -> bytes | None:
        return await self._call("lease", lambda: self.backend.holder(digests), lambda: None)

    async def mark_forwarded(self, compaction_id: str) -> bool:
        # Down: new here; the process's own table (proxy.compacting.decision.applied) still holds,
        # and the mark is written back with the checkpoints.
        marked = await self._call(
            "write", lambda: self.backend.mark_forwarded(compaction_id), _none
        )
        if marked is None:
            self._unsynced_marks[compaction_id] = None
            while len(self._unsynced_marks) > _MAX_UNSYNCED:
                del self._unsynced_marks[next(iter(self._unsynced_marks))]
            return True
        return marked

    async def bound_models(self) -> Sequence[str]:
        # Down: the ones this process learned (the backend learns them back from the next
        # refusal, at most one per model and process).
        local = await self._local.bound_models()
        return await self._call("read", self.backend.bound_models, lambda: local)

    async def add_bound_model(self, model: str) -> None:
        await self._local.add_bound_model(model)
        await self._call("write", lambda: self.backend.add_bound_model(model), lambda: None)

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        # Down: every key is new here; the writer's own de-duplication still holds.
        return await self._call(
            "memory", lambda: self.backend.claim(session_id, keys), lambda: set(keys)
        )

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        await self._call("memory", lambda: self.backend.release(session_id, keys), lambda: None)

    async def wait(self, key: bytes, timeout_s: float) -> None:
        if self._is_down():
            return
        try:
            await self.backend.wait(key, timeout_s)
        except Exception as exc:
            self._failed("wait", exc)

    # -- the guard ---------------------------------------------------------------------------

    async def _call(
        self, operation: str, call: Callable[[], Awaitable[T]], fallback: Callable[[], T]
    ) -> T:
        if self._is_down():
            return fallback()
        try:
            async with asyncio.timeout(self._timeout_s):
                value = await call()
        except Exception as exc:
            self._failed(operation, exc)
            return fallback()
        if self._down_until is not None:
            self._recovered()
        return value

    def _is_down(self) -> bool:
        return self._down_until is not None and self._clock() < self._down_until

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._metrics.errors.labels(backend=self.name, operation=operation).inc()
        if self._down_until is None:
            self._metrics.outages.labels(backend=self.name).inc()
            self._metrics.degraded.labels(backend=self.name).set(1)
            log.warning(
                "state backend unavailable; serving from the in-process cache",
                extra={"backend": self.name, "operation": operation, "error": repr(exc)},
            )
        self._down_until = self._clock() + self._retry_s

    def _recovered(self) -> None:
        self._down_until = None
        self._metrics.degraded.labels(backend=self.name).set(0)
        log.warning("state backend is back", extra={"backend": self.name})
        writing = self._writing_back is not None and not self._writing_back.done()
        unsynced = self._unsynced or self._unsynced_marks
        if unsynced and not writing and not self._tasks.closed:
            self._writing_back = self._tasks.spawn(self._write_back(), name="state-write-back")

    async def _write_back(self) -> None:
        while self._unsynced and not self._is_down():
            batch = list(itertools.islice(self._unsynced.values(), _WRITE_BACK_BATCH))
            written = await asyncio.gather(*(self._put_back(checkpoint) for checkpoint in batch))
            for checkpoint, ok in zip(batch, written, strict=True):
                if ok:
                    self._unsynced.pop(checkpoint.key, None)
        # Then the marks of the compactions that went out meanwhile, so that a restarted process
        # (or another replica) reports those as "reused", not "applied".
        while self._unsynced_marks and not self._unsynced and not self._is_down():
            ids = list(itertools.islice(self._unsynced_marks, _WRITE_BACK_BATCH))
            marked = await asyncio.gather(
                *(self._mark_back(compaction_id) for compaction_id in ids)
            )
            for compaction_id, ok in zip(ids, marked, strict=True):
                if ok:
                    self._unsynced_marks.pop(compaction_id, None)

    async def _put_back(self, checkpoint: Checkpoint) -> bool:
        return await self._call("write", lambda: _true(self.backend.put(checkpoint)), _false)

    async def _mark_back(self, compaction_id: str) -> bool:
        # Written whatever it answers (False: another replica marked it meanwhile).
        mark = self.backend.mark_forwarded
        return await self._call("write", lambda: _true(mark(compaction_id)), _false)


async def _true(call: Awaitable[object]) -> bool:
    await call
    return True


def _false() -> bool:
    return False


def _none() -> None:
    return None
