"""State in one SQLite file that outlives the process (the default backend).

The hot path never touches the file: the keys of every live checkpoint (with their cut and
expiry) and the cooldowns are loaded into memory when the store opens, and checkpoints are read
through a bounded cache, so a reused request is a few dictionary lookups. The file is written by
one thread (a single writer, WAL mode): each `put` joins the rows waiting for that thread and
all of them are committed in one transaction. Expired rows are pruned, and rows beyond
`max_entries` go oldest first, so the file's size is bounded. One process per file: replicas
share state through Redis, not through one SQLite file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
from cachetools import LRUCache

from compaction.checkpoints import Checkpoint
from proxy.compacting.cooldown import Cooldown
from proxy.compacting.stores.backend import Lease, LocalLease

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoints"
    " (key BLOB PRIMARY KEY, cut INTEGER NOT NULL, expires_at REAL NOT NULL, body BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS checkpoints_expiry ON checkpoints (expires_at)",
    "CREATE TABLE IF NOT EXISTS cooldowns"
    " (key TEXT PRIMARY KEY, failures INTEGER NOT NULL, until REAL)",
)
# Checkpoints read back from the file and kept decoded; the keys of all of them stay in memory.
_CACHED_CHECKPOINTS = 1024
_PRUNE_EVERY_S = 60.0
_Row = tuple[str, tuple[Any, ...]]
_Opened = tuple[sqlite3.Connection, dict[bytes, tuple[int, float]], list[tuple[str, int, float]]]


class SqliteStore:
    name = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        max_entries: int,
        ttl_s: float,
        failure_threshold: int,
        failure_cooldown_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        # Wall-clock time: expiries and cooldowns must mean the same after a restart.
        self._clock = clock
        self._cooldown = Cooldown(failure_threshold, failure_cooldown_s, clock)
        self._index: dict[bytes, tuple[int, float]] = {}
        self._cache: LRUCache[bytes, Checkpoint] = LRUCache(_CACHED_CHECKPOINTS)
        self._lease = LocalLease()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Used by the writer thread only; set on the loop once its keys are loaded.
        self._connection: sqlite3.Connection | None = None
        self._opening: asyncio.Future[_Opened] | None = None
        self._pending: list[tuple[_Row, concurrent.futures.Future[None]]] = []
        self._pending_lock = threading.Lock()
        self._commit_queued = False
        self._pruned_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        await self._ensure_open()

    async def close(self) -> None:
        if self._executor is None:
            return
        await self._in_thread(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    async def _ensure_open(self) -> None:
        """Open the file and load its keys; retried by the next call after a failure. A caller
        that gives up (the guard's timeout) leaves the opening running for the next one."""
        if self._connection is not None:
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "state-sqlite")
        if self._opening is None:
            loop = asyncio.get_running_loop()
            self._opening = loop.run_in_executor(self._executor, self._connect)
        opening = self._opening
        try:
            connection, index, cooldowns = await asyncio.shield(opening)
        except Exception:
            self._opening = None  # failed: the next call tries again
            raise
        if self._connection is not None:  # another caller applied it meanwhile
            return
        self._opening = None
        for key, entry in index.items():
            self._index.setdefault(key, entry)
        for name, failures, until in cooldowns:
            self._cooldown.restore(name, failures, until)
        self._connection = connection

    # -- checkpoints -------------------------------------------------------------------------

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        await self._ensure_open()
        now = self._clock()
        index = self._index
        for cut in range(len(digests), 0, -1):
            key = digests[cut - 1]
            entry = index.get(key)
            if entry is None or entry[0] != cut or entry[1] <= now:
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
        await self._write(
            "INSERT OR REPLACE INTO checkpoints (key, cut, expires_at, body) VALUES (?, ?, ?, ?)",
            (checkpoint.key, checkpoint.cut, expires_at, body),
        )

    async def _read(self, key: bytes) -> Checkpoint | None:
        body = await self._in_thread(self._select, key)
        if body is None:
            self._index.pop(key, None)
            return None
        try:
            return Checkpoint.from_json(orjson.loads(body))
        except (ValueError, TypeError, orjson.JSONDecodeError):
            # Written by another version, or damaged: a miss, never a crash.
            self._index.pop(key, None)
            return None

    def _trim(self, now: float) -> None:
        """Forget expired keys, and the oldest beyond max_entries (the file follows suit)."""
        while len(self._index) > self._max_entries:
            del self._index[next(iter(self._index))]
        if now - self._pruned_at >= _PRUNE_EVERY_S:
            self._pruned_at = now
            for key in [k for k, (_, expires_at) in self._index.items() if expires_at <= now]:
                del self._index[key]

    # -- cooldowns and leases ----------------------------------------------------------------

    async def is_cooling(self, key: str) -> bool:
        await self._ensure_open()
        return self._cooldown.is_cooling(key)

    async def record_outcome(self, key: str, *, ok: bool) -> None:
        await self._ensure_open()
        self._cooldown.record(key, ok=ok)
        failures, until = self._cooldown.state_of(key)
        if failures or until is not None:
            await self._write(
                "INSERT OR REPLACE INTO cooldowns (key, failures, until) VALUES (?, ?, ?)",
                (key, failures, until),
            )
        else:
            await self._write("DELETE FROM cooldowns WHERE key = ?", (key,))

    async def acquire(self, key: bytes) -> Lease | None:
        return self._lease

    async def holder(self, digests: Sequence[bytes]) -> bytes | None:
        return None

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        return set(keys)

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        return None

    async def wait(self, key: bytes, timeout_s: float) -> None:
        return None

    # -- the writer thread -------------------------------------------------------------------

    async def _write(self, sql: str, parameters: tuple[Any, ...]) -> None:
        """Queue a row and wait until it is committed, together with whatever else is queued."""
        if self._executor is None:
            raise sqlite3.OperationalError("the state file is closed")
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._pending_lock:
            self._pending.append(((sql, parameters), done))
            idle, self._commit_queued = not self._commit_queued, True
        if idle:  # otherwise the commit already queued takes this row too
            self._executor.submit(self._commit)
        await asyncio.wrap_future(done)

    async def _in_thread(self, call: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise RuntimeError("the state file is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, *args)

    def _connect(self) -> _Opened:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            # Set before the first table exists: freed pages can then be given back.
            connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
            connection.execute("PRAGMA journal_mode = WAL")
            # A commit survives the process being killed; only power loss may cost the last ones.
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute("PRAGMA journal_size_limit = 16777216")
            connection.execute("PRAGMA busy_timeout = 1000")
            for statement in _SCHEMA:
                connection.execute(statement)
            now = self._clock()
            self._prune(connection, now)
            index = {
                bytes(key): (cut, expires_at)
                for key, cut, expires_at in connection.execute(
                    "SELECT key, cut, expires_at FROM checkpoints ORDER BY expires_at"
                )
            }
            cooldowns = list(
                connection.execute(
                    "SELECT key, failures, until FROM cooldowns WHERE until IS NULL OR until > ?",
                    (now,),
                )
            )
        except BaseException:
            connection.close()
            raise
        return connection, index, cooldowns

    def _disconnect(self) -> None:
        self._commit()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _select(self, key: bytes) -> Any:
        """The stored body (bytes, or whatever another writer left there), None if none."""
        connection = self._require()
        row = connection.execute(
            "SELECT body FROM checkpoints WHERE key = ? AND expires_at > ?", (key, self._clock())
        ).fetchone()
        return row[0] if row is not None else None

    def _commit(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
            self._commit_queued = False
        if not batch:
            return
        try:
            connection = self._require()
            with connection:  # one transaction for the whole batch
                connection.execute("BEGIN IMMEDIATE")
                for (sql, parameters), _ in batch:
                    connection.execute(sql, parameters)
                self._prune(connection, self._clock())
        except BaseException as exc:
            for _, done in batch:
                done.set_exception(exc)
            return
        for _, done in batch:
            done.set_result(None)
        # Hand pages freed by pruning back to the file system, a few at a time.
        connection.execute("PRAGMA incremental_vacuum(64)")

    def _prune(self, connection: sqlite3.Connection, now: float) -> None:
        connection.execute("DELETE FROM checkpoints WHERE expires_at <= ?", (now,))
        connection.execute(
            "DELETE FROM checkpoints WHERE key IN (SELECT key FROM checkpoints"
            " ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
            (self._max_entries,),
        )
        connection.execute("DELETE FROM cooldowns WHERE until <= ?", (now,))

    def _require(self) -> sqlite3.Connection:
        if self._connection is None:
            raise sqlite3.OperationalError("the state file is not open")
        return self._connection
