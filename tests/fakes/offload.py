"""An offload that runs each job at once in this process and keeps it (`jobs`).

Not `Inline`: a Compactor or KnownRequests given it packs the messages as for a worker process
(it does not say `crossing = False`), so a test sees what a worker would be sent."""

from __future__ import annotations

from typing import Any


class RecordingOffload:
    def __init__(self) -> None:
        self.jobs: list[Any] = []

    async def run(self, fn: Any, job: Any) -> Any:
        self.jobs.append(job)
        return fn(job)
