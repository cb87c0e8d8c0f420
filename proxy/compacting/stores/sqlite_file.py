"""The SQLite state file and its one writer thread (used by proxy.compacting.stores.sqlite).

Every statement runs on one thread, so the event loop never waits for the disk. A write joins the
rows already waiting and all of them are committed in one transaction (WAL mode), and each commit
prunes expired rows and rows beyond `max_entries` (oldest first) and gives the pages it freed back
to the file system, so the file's size follows what it holds.

The file may vanish (deleted, moved) while the process writes to it: each commit checks that the
path still names it (one stat) and otherwise starts a new file with every row of the old one. A
corrupt file (found at open or by any statement) is moved aside under a timestamped name and a new
one started. Either is logged once and counted (`state_files_replaced_total`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from proxy.compacting.cooldown import FORGET_FAILURES_AFTER_S, MAX_KEYS
from proxy.metrics import StateMetrics

T = TypeVar("T")
log = logging.getLogger(__name__)

_TABLES = ("checkpoints", "cooldowns", "forwarded")
_INCREMENTAL = 2  # PRAGMA auto_vacuum's answer
# Pages given back per commit (of 4 KiB), and freed pages worth checkpointing the log for.
_VACUUM_PAGES = 2048
_CHECKPOINT_AFTER_PAGES = 256

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoints"
    " (key BLOB PRIMARY KEY, cut INTEGER NOT NULL, expires_at REAL NOT NULL, body BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS checkpoints_expiry ON checkpoints (expires_at)",
    "CREATE TABLE IF NOT EXISTS cooldowns"
    " (key TEXT PRIMARY KEY, failures INTEGER NOT NULL, until REAL, failed_at REAL)",
    "CREATE TABLE IF NOT EXISTS forwarded (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)",
)
Index = dict[bytes, tuple[int, float]]
"""Checkpoint key -> (cut, expiry), oldest expiry first."""
Cooldowns = list[tuple[str, int, float, float | None]]
"""Key, consecutive failures, time of the last one, end of the cooldown (if open)."""
Forwarded = dict[str, float]
"""Compaction id -> expiry, of the compactions some request went out with."""
Loaded = tuple[Index, Cooldowns, Forwarded]
_Opened = tuple[sqlite3.Connection, Index, Cooldowns, Forwarded]
Parameter = bytes | str | int | float | None
"""A value bound to a statement."""
_Row = tuple[str, tuple[Parameter, ...]]


class StateFile:
    def __init__(
        self,
        path: Path,
        *,
        max_entries: int,
        metrics: StateMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.path = path
        self._max_entries = max_entries
        self._metrics = metrics
        self._clock = clock
        # The file the connection writes to (device, inode): another there means it vanished.
        self._identity: tuple[int, int] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Used by the writer thread only; set on the loop once the file is open.
        self._connection: sqlite3.Connection | None = None
        self._opening: asyncio.Future[_Opened] | None = None
        self._pending: list[tuple[_Row, concurrent.futures.Future[None]]] = []
        self._pending_lock = threading.Lock()
        self._commit_queued = False

    async def open(self) -> Loaded | None:
        """Open the file: its live keys and cooldowns the first time, None once open. A caller
        that gives up (the guard's timeout) leaves the opening running for the next one; one
        that fails leaves the next to try again."""
        if self._connection is not None:
            return None
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "state-sqlite")
        if self._opening is None:
            loop = asyncio.get_running_loop()
            self._opening = loop.run_in_executor(self._executor, self._connect)
        try:
            connection, index, cooldowns, forwarded = await asyncio.shield(self._opening)
        except Exception:
            self._opening = None
            raise
        if self._connection is not None:  # another caller took it meanwhile
            return None
        self._opening = None
        self._connection = connection
        return index, cooldowns, forwarded

    async def close(self) -> None:
        if self._executor is None:
            return
        await self._in_thread(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    async def read(self, key: bytes) -> object:
        """The stored body of checkpoint `key` (bytes, or whatever another writer left there),
        None if there is none that lives."""
        return await self._in_thread(lambda: self._select(key))

    async def write(self, sql: str, parameters: tuple[Parameter, ...]) -> None:
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

    async def _in_thread(self, call: Callable[[], T]) -> T:
        if self._executor is None:
            raise sqlite3.OperationalError("the state file is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # -- on the writer thread ----------------------------------------------------------------

    def _connect(self) -> _Opened:
        try:
            return self._load()
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise  # locked, unreadable, a full disk: the guard retries later
        self._move_aside()
        return self._load()

    def _load(self) -> _Opened:
        connection = self._new_connection()
        try:
            now = self._clock()
            self._prune(connection, now)
            _vacuum(connection)
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
        except BaseException:
            connection.close()
            raise
        return connection, index, cooldowns, forwarded

    def _new_connection(self) -> sqlite3.Connection:
        """The file at `path`, created if missing, with its pragmas and tables."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = not self.path.exists()
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            # Summaries of users' conversations: private to the proxy's user, like the memory
            # files. Set through the path before the first statement (SQLite gives its -wal and
            # -shm the database file's mode), never by opening the file beside the connection:
            # closing any descriptor of it drops every lock the process holds on it, and the
            # next process to close the database would delete the log still written to.
            if created:
                os.chmod(self.path, 0o600)
            # Set before the first table exists: freed pages can then be given back.
            connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
            connection.execute("PRAGMA journal_mode = WAL")
            # A commit survives the process being killed; only power loss may cost the last ones.
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute("PRAGMA journal_size_limit = 16777216")
            connection.execute("PRAGMA busy_timeout = 1000")
            for statement in _SCHEMA:
                connection.execute(statement)
            _add_failed_at(connection)
            _make_vacuumable(connection)
            stat = os.stat(self.path)
        except BaseException:
            connection.close()
            raise
        self._identity = (stat.st_dev, stat.st_ino)
        return connection

    def _disconnect(self) -> None:
        self._commit()
        if self._connection is not None:
            with contextlib.suppress(sqlite3.Error, OSError):
                self._checked()  # a file that vanished since the last write: keep its rows
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _select(self, key: bytes) -> object:
        """The stored body (bytes, or whatever another writer left there), None if none."""
        connection = self._require()
        try:
            row = connection.execute(
                "SELECT body FROM checkpoints WHERE key = ? AND expires_at > ?",
                (key, self._clock()),
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise
            self._restart_corrupt()
            return None
        return row[0] if row is not None else None

    def _commit(self) -> None:
        with self._pending_lock:
            batch, self._pending = self._pending, []
            self._commit_queued = False
        if not batch:
            return
        try:
            connection = self._write([row for row, _ in batch])
        except BaseException as exc:
            for _, done in batch:
                _settle(done, exc)
            return
        for _, done in batch:
            _settle(done, None)
        with contextlib.suppress(sqlite3.Error):  # a full disk: given back at a later commit
            _vacuum(connection)

    def _write(self, rows: list[_Row]) -> sqlite3.Connection:
        """Commit `rows` in one transaction, with pruning: into a new file if the file vanished
        or turns out corrupt."""
        connection = self._checked()
        try:
            self._transact(connection, rows)
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise
            connection = self._restart_corrupt()
            self._transact(connection, rows)
        return connection

    def _transact(self, connection: sqlite3.Connection, rows: list[_Row]) -> None:
        with connection:
            connection.execute("BEGIN IMMEDIATE")
            for sql, parameters in rows:
                connection.execute(sql, parameters)
            self._prune(connection, self._clock())

    # -- a file that vanished or is corrupt --------------------------------------------------

    def _checked(self) -> sqlite3.Connection:
        """The connection, to a new file holding the same rows if the file it writes to was
        deleted or replaced meanwhile (its writes would otherwise go nowhere): one stat."""
        connection = self._require()
        try:
            stat = os.stat(self.path)
            vanished = (stat.st_dev, stat.st_ino) != self._identity
        except FileNotFoundError:
            vanished = True
        if not vanished:
            return connection
        tables = {table: list(connection.execute(f"SELECT * FROM {table}")) for table in _TABLES}
        # Closed first: closing deletes the -wal and -shm files named after the path, which
        # must not be the new file's.
        self._connection = None
        connection.close()
        fresh = self._new_connection()
        with fresh:
            fresh.execute("BEGIN IMMEDIATE")
            for table, rows in tables.items():
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    fresh.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", rows)
        self._connection = fresh
        self._replaced("vanished", "the state file vanished: a new one holds this process's rows")
        return fresh

    def _restart_corrupt(self) -> sqlite3.Connection:
        """Move the corrupt file aside and go on in a new one (what only the corrupt one held
        is lost; the store finds its rows missing)."""
        if self._connection is not None:
            with contextlib.suppress(sqlite3.Error):
                self._connection.close()
            self._connection = None
        self._move_aside()
        self._connection = self._new_connection()
        return self._connection

    def _move_aside(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for number in itertools.count(2):
            if not aside.exists():
                break
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{number}")
        for suffix in ("", "-wal", "-shm"):  # a stale -wal must not be replayed into a new file
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        self._replaced("corrupt", f"the state file is corrupt: moved aside to {aside.name}")

    def _replaced(self, reason: str, message: str) -> None:
        self._metrics.files_replaced.labels(reason=reason).inc()
        log.warning(message, extra={"path": str(self.path)})

    def _prune(self, connection: sqlite3.Connection, now: float) -> None:
        connection.execute("DELETE FROM checkpoints WHERE expires_at <= ?", (now,))
        connection.execute(
            "DELETE FROM checkpoints WHERE key IN (SELECT key FROM checkpoints"
            " ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
            (self._max_entries,),
        )
        # Cooldowns over, failures a day old (or of a file from before failed_at), and beyond
        # the keys the process keeps: what proxy.compacting.cooldown forgets too.
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

    def _require(self) -> sqlite3.Connection:
        if self._connection is None:
            raise sqlite3.OperationalError("the state file is not open")
        return self._connection


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """The file is damaged or not a database (as opposed to locked, full or unreadable)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _make_vacuumable(connection: sqlite3.Connection) -> None:
    """A file made without incremental vacuum (by an earlier version) is rebuilt once with it."""
    if connection.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
        connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
        connection.execute("VACUUM")


def _vacuum(connection: sqlite3.Connection) -> None:
    """Hand pages freed by pruning back to the file system, a bounded number at a time; after
    many, checkpoint the log so the file itself shrinks now, not at some later checkpoint."""
    freed = int(connection.execute("PRAGMA freelist_count").fetchone()[0])
    if not freed:
        return
    # executescript runs the pragma to its end: execute() would free one page per call.
    connection.executescript(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})")
    if freed >= _CHECKPOINT_AFTER_PAGES:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _add_failed_at(connection: sqlite3.Connection) -> None:
    """Files written before cooldowns kept the time of the last failure get the column."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(cooldowns)")}
    if "failed_at" not in columns:
        connection.execute("ALTER TABLE cooldowns ADD COLUMN failed_at REAL")


def _settle(done: concurrent.futures.Future[None], error: BaseException | None) -> None:
    """Report a row's outcome to its writer, unless the writer gave up (the guard's timeout
    cancelled the future): the other rows of the batch still get theirs."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
