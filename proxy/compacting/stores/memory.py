"""Checkpoints in the process: bounded, least recently used first, each for `ttl_s`. Lost at
restart and not shared between replicas."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from compaction.checkpoints import Checkpoint, MemoryCheckpointStore


class MemoryStore:
    """The async CheckpointStore over the library's in-process table."""

    def __init__(
        self, max_entries: int, ttl_s: float, timer: Callable[[], float] = time.monotonic
    ) -> None:
        self._table = MemoryCheckpointStore(max_entries, ttl_s, timer)

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        return self._table.longest(digests)

    async def put(self, checkpoint: Checkpoint) -> None:
        self._table.put(checkpoint)

    def __len__(self) -> int:
        return len(self._table)
