"""The roles of the state, each a small protocol its consumer receives alone, and the backend
that plays them all.

- checkpoints: compaction.CheckpointStore (Conversations);
- Leases: single-flight across processes (proxy.compacting.background.flight);
- Cooldowns: the summarizer's, per model and tenant (Conversations);
- ForwardedMarks: compactions some request already went out with
  (proxy.compacting.decision.applied);
- claims: compaction.ItemClaims, memory-file items de-duplicated across processes;
- BoundModels: the models learned to bind their thinking to its prefix
  (proxy.compacting.decision.thinking);
- SharedRecords: the session records /admin shows, kept where every replica reads them
  (proxy.admin.records; only `redis` plays it: the other backends' records stay in the process).

A StateBackend plays every role but the shared records and has a lifecycle; it is built once,
in proxy.app.create_app (through proxy.state.factory), which hands each consumer its role.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

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


Document = dict[str, Any]
"""A JSON-able document of the session records: a compaction's record, a timeline line."""


class SessionChange(NamedTuple):
    """What one request or one compaction adds to its session's records (proxy.admin.records
    decides it, once, for the process's records and the shared ones alike): counts added,
    fields set (None: left as they were), a compaction's record or a timeline line appended.
    A named tuple: every request makes one or two (a frozen dataclass cost 2 µs more each)."""

    requests: int = 0
    records: int = 0
    summarizer_calls: int = 0
    summarizer_failures: int = 0
    pinned_overflow: int = 0
    tokens_sent: int = 0
    tokens_forwarded: int = 0
    dialect: str | None = None
    model: str | None = None
    window: int | None = None
    record: Document | None = None
    timeline: Document | None = None


class SessionTotals(NamedTuple):
    """A session's figures as the shared records hold them (times: `time.time()` seconds). A
    named tuple, not a dataclass: a page sorted by another field than the last activity makes
    one per session, 10,000 of them, and a frozen dataclass took three times as long."""

    first_seen: float
    last_seen: float
    requests: int
    records_total: int
    records_kept: int
    dialect: str | None
    model: str | None
    window: int | None
    tokens_sent: int
    tokens_forwarded: int
    summarizer_calls: int
    summarizer_failures: int
    pinned_overflow: int


@dataclass(frozen=True, slots=True)
class SharedSession:
    """One session as the shared records hold it: its totals, its compaction records and its
    timeline (oldest first)."""

    totals: SessionTotals
    records: list[Document]
    timeline: list[Document]


class SharedRecords(Protocol):
    """The session records of every replica in one place, bounded per session and in total
    (least recently seen sessions first). Writes never wait: `add` queues, a background task
    sends; reads raise when the store cannot answer (the caller shows its own process's)."""

    def add(self, session_id: str, change: SessionChange, now: float) -> None: ...

    async def newest(self, offset: int, limit: int) -> tuple[list[tuple[str, SessionTotals]], int]:
        """The sessions seen most recently first, `limit` of them from `offset`, and how many
        there are."""
        ...

    async def every(self) -> list[tuple[str, SessionTotals]]:
        """Every session, most recently seen first."""
        ...

    async def session(self, session_id: str) -> SharedSession | None: ...

    async def open(self) -> None: ...

    async def close(self) -> None:
        """Send what is queued (briefly), then let go of the store."""
        ...
