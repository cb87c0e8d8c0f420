"""Offloads that run each job at once in this process and keep it (`jobs`).

Not `Inline`: each says `crossing = True`, so a Compactor or BodyIndexes given one sends the
messages as to a worker process, and a test sees what a worker would be sent; `Pickling`
also sends each job and its result through pickle, as a worker's pipe does, and keeps the
pickled results (`results`); `SlowFirstPlan` plans slowly the first time."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

from compaction import OffloadLost
from compaction.stages import make_plan


class RecordingOffload:
    crossing = True

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    async def run(self, fn: Any, job: Any) -> Any:
        self.jobs.append(job)
        return fn(job)


class PicklingOffload(RecordingOffload):
    def __init__(self) -> None:
        super().__init__()
        self.results: list[bytes] = []

    async def run(self, fn: Any, job: Any) -> Any:
        self.jobs.append(job)
        result = pickle.dumps(fn(pickle.loads(pickle.dumps(job))))
        self.results.append(result)
        return pickle.loads(result)


class SlowFirstPlan(RecordingOffload):
    """Its first plan takes `delay_s` more, as on a worker pool still starting (about a second
    on first use); `planning` is set once that plan has begun."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.planning = asyncio.Event()

    async def run(self, fn: Any, job: Any) -> Any:
        if fn is make_plan and not self.planning.is_set():
            self.planning.set()
            await asyncio.sleep(self.delay_s)
        return await super().run(fn, job)


class LosingOffload(RecordingOffload):
    """Plans, then loses every later job (as a worker killed mid-job: `OffloadLost`)."""

    async def run(self, fn: Any, job: Any) -> Any:
        if fn is make_plan:
            return await super().run(fn, job)
        self.jobs.append(job)
        raise OffloadLost("lost with its worker")
