"""What a state backend keeps besides checkpoints, and the one place a backend is chosen.

A backend is a CheckpointStore (compaction.checkpoints) that also keeps the summarizer's
cooldowns and the leases of single-flight: in the process (memory), in a file that outlives it
(sqlite), or in Redis shared by replicas. Every persistent or shared backend runs behind
proxy.compacting.stores.guard, so its trouble never reaches a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from compaction import Checkpoint, CheckpointStore
from proxy.metrics import StateMetrics
from proxy.settings import CompactionSection, StateSettings
from proxy.tasks import BackgroundTasks


class Lease(Protocol):
    """The right to compute one checkpoint, held by one process at a time until released. A
    lease that expires renews itself in the background until then, so a holder that died frees
    it within its TTL."""

    async def renew(self) -> bool:
        """Extend it now: False when it was lost (expired and taken by another)."""
        ...

    async def release(self) -> None: ...


class StateBackend(Protocol):
    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None: ...

    async def put(self, checkpoint: Checkpoint) -> None: ...

    async def is_cooling(self, key: str) -> bool:
        """True while the summarizer for `key` (model and tenant) cools down after failures."""
        ...

    async def record_outcome(self, key: str, *, ok: bool) -> None: ...

    async def acquire(self, key: bytes) -> Lease | None:
        """The lease for checkpoint `key`, or None while another process holds it."""
        ...

    async def holder(self, digests: Sequence[bytes]) -> bytes | None:
        """The newest of `digests` whose lease another process may hold (None: none held, or a
        backend only this process uses): a compaction of that conversation is under way."""
        ...

    async def wait(self, key: bytes, timeout_s: float) -> None:
        """Return when the holder of `key`'s lease let go (done, failed or gone) or after
        `timeout_s`, whichever is first; woken by a notice, never by tight polling."""
        ...

    async def mark_forwarded(self, compaction_id: str) -> bool:
        """Record that a request went out with this compaction (proxy.compacting.forwarded):
        True only for the first to record it, atomically, whichever replica it runs in (a
        backend only this process uses: always True, the process's own table decides)."""
        ...

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        """Memory items de-duplicated across processes (compaction.memory.ItemClaims): the keys
        never claimed before for the session. A backend only this process uses claims them all:
        the memory writer's own de-duplication, reloaded from the file, is enough there."""
        ...

    async def release(self, session_id: str, keys: Sequence[str]) -> None: ...


async def stored_under(
    store: CheckpointStore, digests: Sequence[bytes], key: bytes | None
) -> Checkpoint | None:
    """The checkpoint stored under `key`, one of `digests`; None if there is none (any more)."""
    if key is None:
        return None
    try:
        cut = digests.index(key) + 1
    except ValueError:
        return None
    found = await store.longest(digests[:cut])
    return found if found is not None and found.key == key else None


class LocalLease:
    """The lease of a backend that only this process uses: always granted, nothing to renew
    (proxy.compacting.flight already makes concurrent callers of one process share a task)."""

    async def renew(self) -> bool:
        return True

    async def release(self) -> None:
        return None


# A lease is renewed at a third of its lifetime; it lives at most this long without renewal, so a
# replica that dies mid-summary holds the others back at most this long (or summary_timeout_s).
LEASE_TTL_S = 10.0


def build_backend(
    state: StateSettings, options: CompactionSection, metrics: StateMetrics, tasks: BackgroundTasks
) -> StateBackend:
    """The backend `state.backend` names, guarded unless it lives in the process; its background
    work (writing back after an outage) runs in `tasks`."""
    from proxy.compacting.stores.guard import Guarded
    from proxy.compacting.stores.memory import MemoryStore

    local = MemoryStore(
        options.checkpoint_max_entries,
        options.checkpoint_ttl_s,
        failure_threshold=options.failure_threshold,
        failure_cooldown_s=options.failure_cooldown_s,
    )
    if state.backend == "memory":
        return local
    remote: StateBackend
    if state.backend == "sqlite":
        from proxy.compacting.stores.sqlite import SqliteStore

        remote = SqliteStore(
            state.path,
            max_entries=options.checkpoint_max_entries,
            ttl_s=options.checkpoint_ttl_s,
            failure_threshold=options.failure_threshold,
            failure_cooldown_s=options.failure_cooldown_s,
        )
    else:
        from proxy.compacting.stores.redis import RedisStore

        assert state.redis_url is not None  # settings refuse redis without a URL
        remote = RedisStore(
            state.redis_url,
            ttl_s=options.checkpoint_ttl_s,
            failure_threshold=options.failure_threshold,
            failure_cooldown_s=options.failure_cooldown_s,
            lease_ttl_s=min(options.summary_timeout_s, LEASE_TTL_S),
            timeout_s=state.timeout_s,
            tasks=tasks,
        )
    return Guarded(remote, local, metrics, tasks, timeout_s=state.timeout_s, retry_s=state.retry_s)
