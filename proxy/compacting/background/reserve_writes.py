"""The memory-file items of reserves (checkpoints precomputed ahead of the trigger, which may never
be applied and so keep their items), written when a reserve goes out.

Each write is a background task: concurrent requests applying the same reserve join one write,
and a request whose client leaves meanwhile does not stop it. A reserve counts as written only
once its write succeeded, so one that failed (a full disk) is tried again by the next request
that sends the reserve. Once per process; across replicas the memory writer's claims keep the
items to one write.
"""

from __future__ import annotations

import asyncio

from cachetools import LRUCache

from compaction import Checkpoint, Compactor
from proxy.compacting.background.flight import SingleFlight
from proxy.tasks import BackgroundTasks


class ReserveWrites:
    def __init__(self, compactor: Compactor, tasks: BackgroundTasks, max_entries: int) -> None:
        self._compactor = compactor
        self._written: LRUCache[str, None] = LRUCache(max_entries)
        self._writing: SingleFlight[str, None] = SingleFlight(tasks)

    async def flush(self, session_id: str, reserve: Checkpoint) -> None:
        """Write `reserve`'s memory items unless this process has written them already."""
        if reserve.compaction_id in self._written or not reserve.memory_items:
            return
        write = self._writing.start(
            reserve.compaction_id,
            lambda: self._write(session_id, reserve),
            name=f"reserve-items:{session_id}",
        )
        await asyncio.shield(write)

    async def _write(self, session_id: str, reserve: Checkpoint) -> None:
        error = await self._compactor.flush_memory(
            session_id, reserve.compaction_id, reserve.memory_items
        )
        if error is None:  # a failure was logged by the writer
            self._written[reserve.compaction_id] = None
