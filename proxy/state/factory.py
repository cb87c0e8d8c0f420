"""The one place the state is built from settings (`state.backend`): one SQLite file or one Redis
client per process, and each role played over it (`State`).

- `memory`: the process only (LocalStore, LocalArchive);
- `sqlite`: one StateFile (one connection, one thread) holding the checkpoint store's tables and
  the archive's;
- `redis`: one RedisClient shared by the checkpoint store (and its notices), the archive and
  the session records /admin shows (so every replica shows the fleet's).
The checkpoint roles of a persistent or shared backend are guarded (proxy.state.guard).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proxy.metrics import StateMetrics
from proxy.settings import AdminSettings, ArchiveSettings, CompactionSection, StateSettings
from proxy.state.archive.entries import Archive
from proxy.state.archive.local import LocalArchive
from proxy.state.archive.redis import RedisArchive
from proxy.state.archive.sqlite import SqliteArchive
from proxy.state.guard import Guarded
from proxy.state.local import LocalStore
from proxy.state.redis import RedisStore
from proxy.state.redis_client import RedisClient
from proxy.state.redis_records import RedisRecords
from proxy.state.roles import SharedRecords, StateBackend
from proxy.state.sqlite import SqliteStore
from proxy.state.sqlite_file import StateFile
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

# A lease is renewed at a third of its lifetime; it lives at most this long without renewal, so a
# replica that dies mid-summary holds the others back at most this long (or summary_timeout_s).
LEASE_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class State:
    """Every role of the state, over one file or one client: `backend` plays checkpoints,
    leases, cooldowns, forwarded marks and item claims; `archive` keeps folded turns; `records`,
    when the backend is shared (redis), keeps the session records /admin shows (None: they stay
    in the process)."""

    backend: StateBackend
    archive: Archive
    records: SharedRecords | None = None

    async def open(self) -> None:
        """Open every role. A backend that cannot open is the guard's warning; an archive that
        cannot is said once: its writes fail and are counted, its searches answer 503. Never
        fatal (the shared records connect nothing when they open)."""
        await self.backend.open()
        try:
            await self.archive.open()
        except Exception as exc:
            log.warning(
                "archive unavailable", extra={"backend": self.archive.name, "error": repr(exc)}
            )
        if self.records is not None:
            await self.records.open()

    async def close(self) -> None:
        """Close every role (in the reverse order of opening), pending writes landed."""
        if self.records is not None:
            await self.records.close()
        await self.archive.close()
        await self.backend.close()


def build_local(options: CompactionSection, max_entries: int | None = None) -> LocalStore:
    """The process's own state, bounded like the checkpoints of `options` (or to `max_entries`
    when it is only the cache in front of a backend that keeps them all)."""
    return LocalStore(
        min(options.checkpoint_max_entries, max_entries or options.checkpoint_max_entries),
        options.checkpoint_ttl_s,
        failure_threshold=options.failure_threshold,
        failure_cooldown_s=options.failure_cooldown_s,
    )


def build_state(
    state: StateSettings,
    options: CompactionSection,
    archive: ArchiveSettings,
    metrics: StateMetrics,
    tasks: BackgroundTasks,
    *,
    given_archive: Archive | None = None,
    admin: AdminSettings | None = None,
) -> State:
    """The state `state.backend` names, its checkpoint roles guarded unless it lives in the
    process (their background work, writing back after an outage, runs in `tasks`), the archive
    bounded as `archive` says (or `given_archive`, which then is the only archive built), and
    with Redis the shared session records bounded as `admin` says (none without `admin`, or
    while its token is null and /admin is off)."""
    if state.backend == "memory":
        local_archive = given_archive or LocalArchive(
            max_bytes=archive.max_bytes_per_session,
            max_age_s=archive.max_age_s,
            max_total_bytes=archive.memory_max_bytes,
        )
        return State(build_local(options), local_archive)
    # The guard's fallback cache holds what this process wrote or read: as many as the
    # backend's own decoded cache, not the backend's whole table (10,000 checkpoints of ~9 KB
    # and more each, which the file or Redis keeps anyway).
    local = build_local(options, state.cached_checkpoints)
    remote: StateBackend
    kept: Archive
    shared: SharedRecords | None = None
    if state.backend == "sqlite":
        file = StateFile(state.path, metrics=metrics)
        remote = SqliteStore(
            file,
            max_entries=options.checkpoint_max_entries,
            cached=state.cached_checkpoints,
            ttl_s=options.checkpoint_ttl_s,
            failure_threshold=options.failure_threshold,
            failure_cooldown_s=options.failure_cooldown_s,
        )
        kept = given_archive or SqliteArchive(
            file,
            max_bytes=archive.max_bytes_per_session,
            max_age_s=archive.max_age_s,
            max_total_bytes=archive.max_total_bytes,
        )
    else:
        client = _redis_client(state)
        remote = RedisStore(
            client,
            ttl_s=options.checkpoint_ttl_s,
            cached=state.cached_checkpoints,
            failure_threshold=options.failure_threshold,
            failure_cooldown_s=options.failure_cooldown_s,
            lease_ttl_s=min(options.summary_timeout_s, LEASE_TTL_S),
            tasks=tasks,
        )
        kept = given_archive or RedisArchive(
            client,
            max_bytes=archive.max_bytes_per_session,
            max_age_s=archive.max_age_s,
            max_total_bytes=archive.max_total_bytes,
        )
        if admin is not None and admin.token is not None:  # admin off: nobody reads them
            shared = RedisRecords(
                client,
                per_session=admin.records_per_session,
                max_sessions=admin.max_sessions,
                max_bytes=int(admin.max_records_mb * 1024 * 1024),
                metrics=metrics,
                tasks=tasks,
            )
    guarded = Guarded(
        remote, local, metrics, tasks, timeout_s=state.timeout_s, retry_s=state.retry_s
    )
    return State(guarded, kept, shared)


def build_reader(state: StateSettings, archive: ArchiveSettings) -> Archive:
    """The archive as a reader beside a running proxy (the `recall` command): the state file
    opened read-only (a writer closing it last would checkpoint it and delete the proxy's
    -wal), Redis through a client of its own; `memory` has nothing to read."""
    max_bytes, max_age_s = archive.max_bytes_per_session, archive.max_age_s
    if state.backend == "sqlite":
        file = StateFile(state.path, read_only=True)
        return SqliteArchive(file, max_bytes=max_bytes, max_age_s=max_age_s)
    if state.backend == "redis":
        return RedisArchive(_redis_client(state), max_bytes=max_bytes, max_age_s=max_age_s)
    return LocalArchive(max_bytes=max_bytes, max_age_s=max_age_s)


def _redis_client(state: StateSettings) -> RedisClient:
    assert state.redis_url is not None  # settings refuse redis without a URL
    return RedisClient(
        state.redis_url, timeout_s=state.timeout_s, max_connections=state.redis_max_connections
    )
