"""The roles of the state, each a small protocol its consumer receives alone, and the backend
that plays them all.

- checkpoints: compaction.CheckpointStore (Conversations);
- Leases: single-flight across processes (proxy.compacting.background.flight);
- Cooldowns: the summarizer's, per model and tenant (Conversations);
- ForwardedMarks: compactions some request already went out with
  (proxy.compacting.decision.applied);
- claims: compaction.ItemClaims, memory-file items de-duplicated across processes;
- BoundModels: the models learned to bind their thinking to its prefix
  (proxy.compacting.decision.thinking).

A StateBackend plays every role and has a lifecycle; it is built once, in proxy.app.create_app
(through proxy.state.factory), which hands each consumer its role.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from compaction import CheckpointStore, ItemClaims

CACHED_CHECKPOINTS = 1024
"""Checkpoints a persistent or shared backend keeps decoded in the process, unless
`state.cached_checkpoints` says otherwise."""


class Lease(Protocol):
    """The right to compute one checkpoint, held by one process at a time until released. A
    lease that expires renews itself in the background until then, so a holder that died frees
    it within its TTL."""

    async def renew(self) -> bool:
        """Extend it now: False when it was lost (expired and taken by another)."""
        ...

    async def release(self) -> None: ...


class Leases(Protocol):
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


class Cooldowns(Protocol):
    async def is_cooling(self, key: str) -> bool:
        """True while the summarizer for `key` (model and tenant) cools down after failures."""
        ...

    async def record_outcome(self, key: str, *, ok: bool) -> None: ...


class ForwardedMarks(Protocol):
    async def mark_forwarded(self, compaction_id: str) -> bool:
        """Record that a request went out with this compaction (proxy.compacting.decision.applied):
        True only for the first to record it, atomically, whichever replica it runs in (a
        backend only this process uses: always True, the process's own table decides)."""
        ...


MAX_BOUND_MODELS = 1024
"""Bound models a backend keeps, the most recently learned."""


class BoundModels(Protocol):
    async def bound_models(self) -> Sequence[str]:
        """The models learned to refuse a thinking block whose prefix changed (the "bound to a
        different conversation" 400), by this process or another, before a restart or not: at
        most MAX_BOUND_MODELS, the most recently learned."""
        ...

    async def add_bound_model(self, model: str) -> None: ...


class StateBackend(
    CheckpointStore, Leases, Cooldowns, ForwardedMarks, ItemClaims, BoundModels, Protocol
):
    """Every role, in one place: the process (local), a file (sqlite) or Redis (redis)."""

    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...


class LocalLease:
    """The lease of a backend that only this process uses: always granted, nothing to renew
    (proxy.compacting.background.flight already makes concurrent callers of one process share a
    task)."""

    async def renew(self) -> bool:
        return True

    async def release(self) -> None:
        return None
