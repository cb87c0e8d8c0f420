"""Checkpoints, cooldowns, forwarded marks and bound models in the SQLite state file (the
default backend).

The hot path never touches the file: the keys of every live checkpoint (with their cut and
expiry), the cooldowns and the bound models are loaded into memory when the store opens, and
checkpoints are read
through a bounded cache, so a reused request is a few dictionary lookups. The file itself, with
its one connection, its single writer thread, batched commits and pruning, is
proxy.state.sqlite_file; this module's tables (`CheckpointTables`) are attached to it.
One process per file: replicas share state through Redis, not through one SQLite file.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence

import orjson
from cachetools import LRUCache

from compaction import Checkpoint
from proxy.state.cooldown import FORGET_FAILURES_AFTER_S, MAX_KEYS, Cooldown, CooldownState
from proxy.state.roles import CACHED_CHECKPOINTS, MAX_BOUND_MODELS, Lease, LocalLease
from proxy.state.sqlite_file import StateFile, is_corrupt

_PRUNE_EVERY_S = 60.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoints"
    " (key BLOB PRIMARY KEY, cut INTEGER NOT NULL, expires_at REAL NOT NULL, body BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS checkpoints_expiry ON checkpoints (expires_at)",
    "CREATE TABLE IF NOT EXISTS cooldowns"
    " (key TEXT PRIMARY KEY, failures INTEGER NOT NULL, until REAL, failed_at REAL)",
    "CREATE TABLE IF NOT EXISTS forwarded (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS bound_models (model TEXT PRIMARY KEY, learned_at REAL NOT NULL)",
)
Index = dict[bytes, tuple[int, float]]
"""Checkpoint key -> (cut, expiry), oldest expiry first."""
Cooldowns = list[tuple[str, int, float, float | None]]
"""Key, consecutive failures, time of the last one, end of the cooldown (if open)."""
Forwarded = dict[str, float]
"""Compaction id -> expiry, of the compactions some request went out with."""
Bound = list[str]
"""The bound models, oldest learned first."""
Loaded = tuple[Index, Cooldowns, Forwarded, Bound]


class CheckpointTables:
    """The store's tables in the state file (proxy.state.sqlite_file.Tables): made, pruned
    and loaded on the file's thread; what was loaded waits in `loaded` for the store."""

    carried: tuple[str, ...] = ("checkpoints", "cooldowns", "forwarded", "bound_models")

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        # Appended on the file's thread, taken on the loop (list operations are atomic).
        self.loaded: list[Loaded] = []

    def create(self, connection: sqlite3.Connection, *, read_only: bool) -> None:
        if read_only:
            return
        for statement in _SCHEMA:
            connection.execute(statement)
        _add_failed_at(connection)

    def load(self, connection: sqlite3.Connection) -> None:
        index = {
            bytes(key): (cut, expires_at)
            for key, cut, expires_at in connection.execute(
                "SELECT key, cut, expires_at FROM checkpoints ORDER BY expires_at"
            )
        }
        cooldowns = list(
            connection.execute(
                "SELECT key, failures, coalesce(failed_at, 0.0), until FROM cooldowns"
            )
        )
        forwarded = dict(
            connection.execute("SELECT id, expires_at FROM forwarded ORDER BY expires_at")
        )
        bound = [
            model
            for (model,) in connection.execute("SELECT model FROM bound_models ORDER BY learned_at")
        ]
        self.loaded.append((index, cooldowns, forwarded, bound))

    def prune(self, connection: sqlite3.Connection, now: float) -> None:
        connection.execute("DELETE FROM checkpoints WHERE expires_at <= ?", (now,))
        connection.execute(
            "DELETE FROM checkpoints WHERE key IN (SELECT key FROM checkpoints"
            " ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
            (self._max_entries,),
        )
        # Cooldowns over, failures a day old (or of a file from before failed_at), and beyond
        # the keys the process keeps: what proxy.state.cooldown forgets too.
        connection.execute(
            "DELETE FROM cooldowns WHERE until <= ? OR (until IS NULL AND"
            " (failed_at IS NULL OR failed_at <= ?))",
            (now, now - FORGET_FAILURES_AFTER_S),
        )
        connection.execute(
            "DELETE FROM cooldowns WHERE key IN (SELECT key FROM cooldowns"
            " ORDER BY failed_at DESC LIMIT -1 OFFSET ?)",
            (MAX_KEYS,),
        )
        connection.execute("DELETE FROM forwarded WHERE expires_at <= ?", (now,))
        connection.execute(
            "DELETE FROM forwarded WHERE id IN (SELECT id FROM forwarded"
            " ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
            (self._max_entries,),
        )
        connection.execute(
            "DELETE FROM bound_models WHERE model IN (SELECT model FROM bound_models"
            " ORDER BY learned_at DESC LIMIT -1 OFFSET ?)",
            (MAX_BOUND_MODELS,),
        )


class SqliteStore:
    name = "sqlite"

    def __init__(
        self,
        file: StateFile,
        *,
        max_entries: int,
        ttl_s: float,
        cached: int = CACHED_CHECKPOINTS,
        failure_threshold: int,
        failure_cooldown_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Over `file`, the process's one connection to the state file (its clock should be
        this one's: expiries are wall-clock time)."""
        self.file = file
        self.path = file.path
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        # Wall-clock time: expiries and cooldowns must mean the same after a restart.
        self._clock = clock
        self._cooldown = Cooldown(failure_threshold, failure_cooldown_s, clock)
        self._index: dict[bytes, tuple[int, float]] = {}
        self._forwarded: dict[str, float] = {}  # compaction id -> expiry, oldest first
        self._bound: dict[str, None] = {}  # bound models, oldest learned first
        # Checkpoints read back from the file or written, kept decoded: `cached` of them (a
        # reserve's carries its memory items, ~10 KB and more), never more than the file keeps
        # (a larger cache would keep checkpoints whose keys are already forgotten). The keys of
        # all of them stay in memory.
        self._cache: LRUCache[bytes, Checkpoint] = LRUCache(min(cached, max_entries))
        self._lease = LocalLease()
        self._tables = CheckpointTables(max_entries)
        file.attach(self._tables)
        self._pruned_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self._ensure_open()

    async def close(self) -> None:
        await self.file.close()

    async def _ensure_open(self) -> None:
        """Open the file once (retried by the next call after a failure) and take its keys."""
        await self.file.open()
        loaded = self._tables.loaded
        while loaded:
            self._restore(*loaded.pop(0))

    def _restore(
        self, index: Index, cooldowns: Cooldowns, forwarded: Forwarded, bound: Bound
    ) -> None:
        for model in bound:
            self._bound.setdefault(model, None)
        for compaction_id, expires_at in forwarded.items():
            self._forwarded.setdefault(compaction_id, expires_at)
        for key, entry in index.items():
            self._index.setdefault(key, entry)
        for name, failures, failed_at, until in cooldowns:
            self._cooldown.restore(name, CooldownState(failures, failed_at, until))

    # -- checkpoints -------------------------------------------------------------------------

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        await self._ensure_open()
        now = self._clock()
        index = self._index
        # Newest first, the digests not in the index skipped at C speed (a reused request's view
        # keeps thousands of items after its checkpoint); a key found is checked at the position
        # its cut names (chained digests never repeat within a request).
        for key in filter(index.__contains__, reversed(digests)):
            cut, expires_at = index[key]
            if not 0 < cut <= len(digests) or digests[cut - 1] != key or expires_at <= now:
                continue
            found = self._cache.get(key)
            if found is None:
                found = await self._read(key)
                if found is None or found.cut != cut:
                    continue
                self._cache[key] = found
            return found
        return None

    async def put(self, checkpoint: Checkpoint) -> None:
        await self._ensure_open()
        now = self._clock()
        expires_at = now + self._ttl_s
        self._index.pop(checkpoint.key, None)  # re-inserted last: the dict stays oldest first
        self._index[checkpoint.key] = (checkpoint.cut, expires_at)
        self._cache[checkpoint.key] = checkpoint
        self._trim(now)
        body = orjson.dumps(checkpoint.to_json())
        await self.file.write(
            "INSERT OR REPLACE INTO checkpoints (key, cut, expires_at, body) VALUES (?, ?, ?, ?)",
            (checkpoint.key, checkpoint.cut, expires_at, body),
        )

    async def _read(self, key: bytes) -> Checkpoint | None:
        try:
            body = await self.file.run(lambda connection: self._select(connection, key))
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            body = None  # the file started afresh: its rows are gone
        if not isinstance(body, bytes | str):  # gone (None), or left by another writer
            self._index.pop(key, None)
            return None
        try:
            return Checkpoint.from_json(orjson.loads(body))
        except (ValueError, TypeError, orjson.JSONDecodeError):
            # Written by another version, or damaged: a miss, never a crash.
            self._index.pop(key, None)
            return None

    def _select(self, connection: sqlite3.Connection, key: bytes) -> object:
        """The stored body (bytes, or whatever another writer left there), None if none."""
        row = connection.execute(
            "SELECT body FROM checkpoints WHERE key = ? AND expires_at > ?", (key, self._clock())
        ).fetchone()
        return row[0] if row is not None else None

    def _trim(self, now: float) -> None:
        """Forget expired keys, and the oldest beyond max_entries (the file follows suit)."""
        while len(self._index) > self._max_entries:
            self._forget(next(iter(self._index)))
        if now - self._pruned_at >= _PRUNE_EVERY_S:
            self._pruned_at = now
            for key in [k for k, (_, expires_at) in self._index.items() if expires_at <= now]:
                self._forget(key)

    def _forget(self, key: bytes) -> None:
        """A key no longer found: its decoded checkpoint goes with it."""
        del self._index[key]
        self._cache.pop(key, None)

    # -- cooldowns and leases ----------------------------------------------------------------

    async def is_cooling(self, key: str) -> bool:
        await self._ensure_open()
        return self._cooldown.is_cooling(key)

    async def record_outcome(self, key: str, *, ok: bool) -> None:
        await self._ensure_open()
        self._cooldown.record(key, ok=ok)
        state = self._cooldown.state_of(key)
        if state is not None:
            await self.file.write(
                "INSERT OR REPLACE INTO cooldowns (key, failures, failed_at, until)"
                " VALUES (?, ?, ?, ?)",
                (key, *state),
            )
        else:
            await self.file.write("DELETE FROM cooldowns WHERE key = ?", (key,))

    async def mark_forwarded(self, compaction_id: str) -> bool:
        await self._ensure_open()
        now = self._clock()
        known = self._forwarded.get(compaction_id)
        if known is not None and known > now:
            return False  # forwarded by this process before a restart
        expires_at = now + self._ttl_s
        # Known only once written: a mark that did not land (a full disk) is written again when
        # the guard writes back after the outage (proxy.compacting.decision.applied keeps concurrent
        # callers of this process apart meanwhile).
        await self.file.write(
            "INSERT OR REPLACE INTO forwarded (id, expires_at) VALUES (?, ?)",
            (compaction_id, expires_at),
        )
        self._forwarded[compaction_id] = expires_at
        while len(self._forwarded) > self._max_entries:
            del self._forwarded[next(iter(self._forwarded))]
        return True

    async def bound_models(self) -> Sequence[str]:
        await self._ensure_open()
        return list(self._bound)

    async def add_bound_model(self, model: str) -> None:
        await self._ensure_open()
        await self.file.write(
            "INSERT OR REPLACE INTO bound_models (model, learned_at) VALUES (?, ?)",
            (model, self._clock()),
        )
        self._bound.pop(model, None)
        self._bound[model] = None
        while len(self._bound) > MAX_BOUND_MODELS:
            del self._bound[next(iter(self._bound))]

    # Leases and claims are the process's own (one process per file); each still opens the file
    # first, so that a call that succeeds tells the guard the file works.

    async def acquire(self, key: bytes) -> Lease | None:
        await self._ensure_open()
        return self._lease

    async def holder(self, digests: Sequence[bytes]) -> bytes | None:
        await self._ensure_open()
        return None

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        await self._ensure_open()
        return set(keys)

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        return None

    async def wait(self, key: bytes, timeout_s: float) -> None:
        return None


def _add_failed_at(connection: sqlite3.Connection) -> None:
    """Files written before cooldowns kept the time of the last failure get the column."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(cooldowns)")}
    if "failed_at" not in columns:
        connection.execute("ALTER TABLE cooldowns ADD COLUMN failed_at REAL")
