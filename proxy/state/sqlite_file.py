"""The SQLite state file: the one place it is opened, its one connection and its one thread.

Every consumer of the file (the checkpoint store, proxy.state.sqlite; the archive,
proxy.state.archive.sqlite) attaches its `Tables` and works through this connection: the file is
opened once per process, with one set of pragmas (WAL), and every statement runs on one thread,
so the event loop never waits for the disk and two connections of one process never contend for
the file's lock. A write joins the rows already waiting and all of them are committed in one
transaction; each commit prunes what the tables' bounds drop and gives the pages it freed back to
the file system, so the file's size follows what it holds.

The file is never opened beside the connection: closing any descriptor of it drops every lock
the process holds on it (https://www.sqlite.org/howtocorrupt.html, section 2.2), and the next
process to close the database (the `recall` command, `sqlite3`, a backup) would then checkpoint
and delete the -wal and -shm this connection still writes to. A reader beside a running proxy
opens it read-only (`read_only`).

The file may vanish (deleted, moved, replaced) while the process writes to it: each statement
checks that the path still names it (one stat) and otherwise starts a new file with the rows of
the tables that carry over (the archive's do not: it can be far larger, and a recall that finds
less is a loss, never an error). A corrupt file (found at open or by any statement) is moved
aside under a timestamped name and a new one started. Either is logged once and counted
(`state_files_replaced_total`).
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
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from proxy.metrics import StateMetrics

T = TypeVar("T")
log = logging.getLogger(__name__)

_INCREMENTAL = 2  # PRAGMA auto_vacuum's answer
# Pages given back per commit (of 4 KiB), and freed pages worth checkpointing the log for.
_VACUUM_PAGES = 2048
_CHECKPOINT_AFTER_PAGES = 256

Parameter = bytes | str | int | float | None
"""A value bound to a statement."""
_Row = tuple[str, tuple[Parameter, ...]]


class Tables(Protocol):
    """What one consumer keeps in the state file. Every method runs on the file's thread."""

    carried: tuple[str, ...]
    """The tables copied into a new file when the file vanished while in use."""

    def create(self, connection: sqlite3.Connection, *, read_only: bool) -> None:
        """Make the tables in a connection just opened (read-only: find them, make nothing)."""
        ...

    def prune(self, connection: sqlite3.Connection, now: float) -> None:
        """Drop what the bounds leave out: at open, and inside each batched commit."""
        ...

    def load(self, connection: sqlite3.Connection) -> None:
        """Read what the consumer keeps in memory, once the file is opened (not again when a
        vanished or corrupt file is replaced: the consumer's memory already holds it)."""
        ...


class StateFile:
    def __init__(
        self,
        path: Path,
        *,
        metrics: StateMetrics | None = None,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
    ) -> None:
        """`metrics` count the files replaced (None: a reader, which replaces none)."""
        self.path = path
        self.read_only = read_only
        self._metrics = metrics
        self._clock = clock
        self._tables: list[Tables] = []
        self._users = 0
        # The file the connection writes to (device, inode): another there means it vanished.
        self._identity: tuple[int, int] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Set and replaced on the writer thread only; read on the loop to skip opening.
        self._connection: sqlite3.Connection | None = None
        self._opening: asyncio.Future[None] | None = None
        self._pending: list[tuple[_Row, concurrent.futures.Future[None]]] = []
        self._pending_lock = threading.Lock()
        self._commit_queued = False

    def attach(self, tables: Tables) -> None:
        """A consumer's tables, made at every connection; the consumer closes the file once
        (the last to close it closes it)."""
        self._tables.append(tables)
        self._users += 1

    async def open(self) -> None:
        """Open the file (the attached tables made, pruned and loaded) unless it is open. A
        caller that gives up (the guard's timeout) leaves the opening running for the next
        one; one that fails leaves the next to try again."""
        if self._connection is not None:
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "state-sqlite")
        opening = self._opening
        if opening is None:
            loop = asyncio.get_running_loop()
            opening = self._opening = loop.run_in_executor(self._executor, self._ensure_open)
        try:
            await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening is opening:
                self._opening = None

    async def close(self) -> None:
        """One consumer is done: the last one commits what waits and closes the file."""
        self._users = max(0, self._users - 1)
        if self._users or self._executor is None:
            return
        await self._in_thread(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`work` on the file's thread, against the file the path names now (opened if it is
        not). A corrupt file it finds is moved aside and a new one started before its error is
        raised."""
        return await self._in_thread(lambda: self._run(work))

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

    def _ensure_open(self) -> None:
        if self._connection is not None:
            return
        try:
            connection = self._load()
        except sqlite3.DatabaseError as exc:
            if self.read_only or not is_corrupt(exc):
                raise  # locked, unreadable, a full disk: the guard retries later
            self._move_aside()
            connection = self._load()
        self._connection = connection

    def _load(self) -> sqlite3.Connection:
        connection = self._new_connection()
        try:
            if not self.read_only:
                now = self._clock()
                for tables in self._tables:
                    tables.prune(connection, now)
                vacuum(connection)
            for tables in self._tables:
                tables.load(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def _new_connection(self) -> sqlite3.Connection:
        """The file at `path` with its pragmas and every attached table, created if missing
        (read-only: as it is)."""
        if self.read_only:
            return self._new_reader()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = not self.path.exists()
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            # Summaries and users' conversations verbatim: private to the proxy's user, like
            # the memory files. Set through the path before the first statement (SQLite gives
            # its -wal and -shm the database file's mode), never by opening the file beside the
            # connection (the module's docstring says why).
            if created:
                os.chmod(self.path, 0o600)
            # Set before the first table exists: freed pages can then be given back.
            connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
            connection.execute("PRAGMA journal_mode = WAL")
            # A commit survives the process being killed; only power loss may cost the last ones.
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute("PRAGMA journal_size_limit = 16777216")
            connection.execute("PRAGMA busy_timeout = 1000")
            for tables in self._tables:
                tables.create(connection, read_only=False)
            _make_vacuumable(connection)
            stat = os.stat(self.path)
        except BaseException:
            connection.close()
            raise
        self._identity = (stat.st_dev, stat.st_ino)
        return connection

    def _new_reader(self) -> sqlite3.Connection:
        """A reader beside a running proxy (the command line): it never writes, so it can
        neither checkpoint nor delete the proxy's -wal and -shm when it closes."""
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
        connection = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            connection.execute("PRAGMA busy_timeout = 1000")
            for tables in self._tables:
                tables.create(connection, read_only=True)
            stat = os.stat(self.path)
        except BaseException:
            connection.close()
            raise
        self._identity = (stat.st_dev, stat.st_ino)
        return connection

    def _disconnect(self) -> None:
        self._commit()
        if self._connection is not None and not self.read_only:
            with contextlib.suppress(sqlite3.Error, OSError):
                self._checked()  # a file that vanished since the last write: keep its rows
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        self._ensure_open()
        connection = self._checked()
        try:
            return work(connection)
        except sqlite3.DatabaseError as exc:
            if not self.read_only and is_corrupt(exc):
                self._restart_corrupt()
            raise

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
            vacuum(connection)

    def _write(self, rows: list[_Row]) -> sqlite3.Connection:
        """Commit `rows` in one transaction, with pruning: into a new file if the file vanished
        or turns out corrupt."""
        connection = self._checked()
        try:
            self._transact(connection, rows)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            connection = self._restart_corrupt()
            self._transact(connection, rows)
        return connection

    def _transact(self, connection: sqlite3.Connection, rows: list[_Row]) -> None:
        with connection:
            connection.execute("BEGIN IMMEDIATE")
            for sql, parameters in rows:
                connection.execute(sql, parameters)
            now = self._clock()
            for tables in self._tables:
                tables.prune(connection, now)

    # -- a file that vanished or is corrupt --------------------------------------------------

    def _checked(self) -> sqlite3.Connection:
        """The connection, to a new file holding the same carried rows if the file it writes
        to was deleted or replaced meanwhile (its writes would otherwise go nowhere): one
        stat. A reader goes on reading the file it opened."""
        connection = self._require()
        if self.read_only:
            return connection
        try:
            stat = os.stat(self.path)
            vanished = (stat.st_dev, stat.st_ino) != self._identity
        except FileNotFoundError:
            vanished = True
        if not vanished:
            return connection
        carried = {
            table: list(connection.execute(f"SELECT * FROM {table}"))
            for tables in self._tables
            for table in tables.carried
        }
        # Closed first: closing deletes the -wal and -shm files named after the path, which
        # must not be the new file's.
        self._connection = None
        connection.close()
        fresh = self._new_connection()
        with fresh:
            fresh.execute("BEGIN IMMEDIATE")
            for table, rows in carried.items():
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    fresh.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", rows)
        self._connection = fresh
        self._replaced("vanished", "the state file vanished: a new one holds this process's rows")
        return fresh

    def _restart_corrupt(self) -> sqlite3.Connection:
        """Move the corrupt file aside and go on in a new one (what only the corrupt one held
        is lost; the consumers find their rows missing)."""
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
        if self._metrics is not None:
            self._metrics.files_replaced.labels(reason=reason).inc()
        log.warning(message, extra={"path": str(self.path)})

    def _require(self) -> sqlite3.Connection:
        if self._connection is None:
            raise sqlite3.OperationalError("the state file is not open")
        return self._connection


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """The file is damaged or not a database (as opposed to locked, full or unreadable)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _make_vacuumable(connection: sqlite3.Connection) -> None:
    """A file made without incremental vacuum (by an earlier version) is rebuilt once with it."""
    if connection.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL:
        connection.execute("PRAGMA auto_vacuum = INCREMENTAL")
        connection.execute("VACUUM")


def vacuum(connection: sqlite3.Connection, *, shrink: bool = False) -> None:
    """Hand pages freed by pruning back to the file system, a bounded number at a time; after
    many (or any, with `shrink`: a writer that keeps the file within a bound), checkpoint the
    log so the file itself shrinks now, not at some later checkpoint."""
    freed = int(connection.execute("PRAGMA freelist_count").fetchone()[0])
    if not freed:
        return
    # executescript runs the pragma to its end: execute() would free one page per call.
    connection.executescript(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})")
    if shrink or freed >= _CHECKPOINT_AFTER_PAGES:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _settle(done: concurrent.futures.Future[None], error: BaseException | None) -> None:
    """Report a row's outcome to its writer, unless the writer gave up (the guard's timeout
    cancelled the future): the other rows of the batch still get theirs."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
