"""State in the process: checkpoints (bounded, least recently used first, each for `ttl_s`),
cooldowns, bound models, and leases that are always granted. Lost at restart and not shared
between replicas;
also the in-process cache that a guarded backend falls back to. (`state.backend: memory` in the
configuration.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from compaction import Checkpoint, CheckpointCache
from proxy.state.cooldown import Cooldown
from proxy.state.roles import MAX_BOUND_MODELS, Lease, LocalLease


class LocalStore:
    """The async state backend over the library's in-process table."""

    name = "memory"  # the configuration's word for it

    def __init__(
        self,
        max_entries: int,
        ttl_s: float,
        timer: Callable[[], float] = time.monotonic,
        *,
        failure_threshold: int = 3,
        failure_cooldown_s: float = 300,
    ) -> None:
        self._table = CheckpointCache(max_entries, ttl_s, timer)
        self._cooldown = Cooldown(failure_threshold, failure_cooldown_s, timer)
        self._lease = LocalLease()
        self._bound: dict[str, None] = {}  # oldest learned first

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        return self._table.longest(digests)

    async def put(self, checkpoint: Checkpoint) -> None:
        self._table.put(checkpoint)

    def remember(self, checkpoint: Checkpoint) -> None:
        """Keep a checkpoint read elsewhere (the guard's read-through cache)."""
        if self._table.get(checkpoint.key) is None:
            self._table.put(checkpoint)

    async def is_cooling(self, key: str) -> bool:
        return self._cooldown.is_cooling(key)

    async def record_outcome(self, key: str, *, ok: bool) -> None:
        self._cooldown.record(key, ok=ok)

    async def bound_models(self) -> Sequence[str]:
        return list(self._bound)

    async def add_bound_model(self, model: str) -> None:
        self._bound.pop(model, None)
        self._bound[model] = None
        while len(self._bound) > MAX_BOUND_MODELS:
            del self._bound[next(iter(self._bound))]

    async def acquire(self, key: bytes) -> Lease | None:
        return self._lease

    async def holder(self, digests: Sequence[bytes]) -> bytes | None:
        return None

    async def mark_forwarded(self, compaction_id: str) -> bool:
        return True  # proxy.compacting.decision.applied keeps what this process sent

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        return set(keys)

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        return None

    async def wait(self, key: bytes, timeout_s: float) -> None:
        return None

    def __len__(self) -> int:
        return len(self._table)
