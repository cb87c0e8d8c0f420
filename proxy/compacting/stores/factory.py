"""The one place a state backend is chosen from settings (`state.backend`)."""

from __future__ import annotations

from proxy.compacting.stores.guard import Guarded
from proxy.compacting.stores.local import LocalStore
from proxy.compacting.stores.redis import RedisStore
from proxy.compacting.stores.roles import StateBackend
from proxy.compacting.stores.sqlite import SqliteStore
from proxy.metrics import StateMetrics
from proxy.settings import CompactionSection, StateSettings
from proxy.tasks import BackgroundTasks

# A lease is renewed at a third of its lifetime; it lives at most this long without renewal, so a
# replica that dies mid-summary holds the others back at most this long (or summary_timeout_s).
LEASE_TTL_S = 10.0


def build_local(options: CompactionSection, max_entries: int | None = None) -> LocalStore:
    """The process's own state, bounded like the checkpoints of `options` (or to `max_entries`
    when it is only the cache in front of a backend that keeps them all)."""
    return LocalStore(
        min(options.checkpoint_max_entries, max_entries or options.checkpoint_max_entries),
        options.checkpoint_ttl_s,
        failure_threshold=options.failure_threshold,
        failure_cooldown_s=options.failure_cooldown_s,
    )


def build_backend(
    state: StateSettings, options: CompactionSection, metrics: StateMetrics, tasks: BackgroundTasks
) -> StateBackend:
    """The backend `state.backend` names, guarded unless it lives in the process; its background
    work (writing back after an outage) runs in `tasks`."""
    if state.backend == "memory":
        return build_local(options)
    # The guard's fallback cache holds what this process wrote or read: as many as the
    # backend's own decoded cache, not the backend's whole table (10,000 checkpoints of ~9 KB
    # and more each, which the file or Redis keeps anyway).
    local = build_local(options, state.cached_checkpoints)
    remote: StateBackend
    if state.backend == "sqlite":
        remote = SqliteStore(
            state.path,
            max_entries=options.checkpoint_max_entries,
            cached=state.cached_checkpoints,
            ttl_s=options.checkpoint_ttl_s,
            failure_threshold=options.failure_threshold,
            failure_cooldown_s=options.failure_cooldown_s,
            metrics=metrics,
        )
    else:
        assert state.redis_url is not None  # settings refuse redis without a URL
        remote = RedisStore(
            state.redis_url,
            ttl_s=options.checkpoint_ttl_s,
            cached=state.cached_checkpoints,
            failure_threshold=options.failure_threshold,
            failure_cooldown_s=options.failure_cooldown_s,
            lease_ttl_s=min(options.summary_timeout_s, LEASE_TTL_S),
            timeout_s=state.timeout_s,
            max_connections=state.redis_max_connections,
            tasks=tasks,
        )
    return Guarded(remote, local, metrics, tasks, timeout_s=state.timeout_s, retry_s=state.retry_s)
