"""The archive in the state file (`state.backend: sqlite`), with an FTS5 full-text index in the
same file; where this SQLite lacks FTS5, a LIKE scan of the session's turns, said once in the log.

Every statement runs on the archive's own thread (its own connection to the file, WAL mode), so
the event loop never waits for the disk. A search walks the index's matches best first (FTS5
ranks them in its own index) and keeps those of its session (and credential) until it has its
`limit`: it never returns another scope's turns. (A scope token in the index, intersected with
the words, cost ten times more: its list holds every turn of the session.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from proxy.archive.entries import Entry, Found, Kind, Scope
from proxy.archive.terms import query_terms, score_text

T = TypeVar("T")
log = logging.getLogger(__name__)

_TABLE = (
    "CREATE TABLE IF NOT EXISTS archive (id INTEGER PRIMARY KEY, session TEXT NOT NULL,"
    " tenant TEXT NOT NULL, idx INTEGER NOT NULL, dialect TEXT NOT NULL, kind TEXT NOT NULL,"
    " compaction_id TEXT NOT NULL, at REAL NOT NULL, size INTEGER NOT NULL,"
    " body TEXT NOT NULL, text TEXT NOT NULL, UNIQUE (session, tenant, idx))",
    "CREATE INDEX IF NOT EXISTS archive_at ON archive (at)",
    # Whose each turn is, in rows small enough that a search checks hundreds per page read.
    "CREATE TABLE IF NOT EXISTS archive_owners (id INTEGER PRIMARY KEY, owner INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS archive_sizes (session TEXT NOT NULL, tenant TEXT NOT NULL,"
    " bytes INTEGER NOT NULL, PRIMARY KEY (session, tenant))",
)
_INDEX = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS archive_fts USING fts5(text,"
    " content='archive', content_rowid='id', tokenize='unicode61 remove_diacritics 2')"
)
_COLUMNS = "a.idx, a.kind, a.text, a.body, a.compaction_id, a.at"
RANKED = 200
"""A search ranks (bm25) the newest this many turns of its scope that hold its words: ranking
costs microseconds a turn, and a common word is held by tens of thousands (all of them ranked:
15 ms at 100k turns). Scoring the texts in Python instead read them all: 70 ms."""


def owner_of(session: str, tenant: str) -> int:
    """The session and credential as one signed 64-bit integer (a digest's first 8 bytes)."""
    digest = hashlib.sha256(f"{tenant}\x00{session}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Dropping the oldest beyond the size bound reads them this many at a time.
_DROP_BATCH = 256


class SqliteArchive:
    name = "sqlite"

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        max_age_s: float,
        full_text: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`full_text=False` searches by LIKE even where FTS5 exists (how the fallback is
        tested)."""
        self.path = path
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._want_full_text = full_text
        self.full_text = False
        self._clock = clock
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None  # the archive thread's only

    async def open(self) -> None:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "archive-sqlite")
        await self._run(self._connect)

    async def close(self) -> None:
        if self._executor is None:
            return
        await self._run(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    async def _run(self, work: Callable[[], T]) -> T:
        if self._executor is None:
            raise RuntimeError("the archive is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def _connect(self) -> None:
        if self._connection is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA busy_timeout=5000")
        for statement in _TABLE:
            connection.execute(statement)
        if self._want_full_text:
            try:
                connection.execute(_INDEX)
                self.full_text = True
            except sqlite3.OperationalError as exc:
                log.warning(
                    "archive search without a full-text index (this SQLite has no FTS5): LIKE",
                    extra={"error": str(exc)},
                )
        self._connection = connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise RuntimeError("the archive is not open")
        return self._connection

    # -- writing ------------------------------------------------------------------------------

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        return await self._run(lambda: self._add(scope, entries))

    def _add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        db = self._db()
        with db:  # one transaction
            db.execute("BEGIN IMMEDIATE")
            added = 0
            for entry in entries:
                cursor = db.execute(
                    "INSERT OR IGNORE INTO archive (session, tenant, idx, dialect, kind,"
                    " compaction_id, at, size, body, text)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (scope.session, scope.tenant, entry.index, entry.dialect, entry.kind,
                     entry.compaction_id, entry.at, entry.size, entry.body, entry.text),
                )  # fmt: skip
                if cursor.rowcount != 1:
                    continue
                added += entry.size
                db.execute(
                    "INSERT INTO archive_owners (id, owner) VALUES (?, ?)",
                    (cursor.lastrowid, owner_of(scope.session, scope.tenant)),
                )
                if self.full_text:
                    db.execute(
                        "INSERT INTO archive_fts (rowid, text) VALUES (?, ?)",
                        (cursor.lastrowid, entry.text),
                    )
            db.execute(
                "INSERT INTO archive_sizes (session, tenant, bytes) VALUES (?, ?, ?)"
                " ON CONFLICT (session, tenant) DO UPDATE SET bytes = bytes + excluded.bytes",
                (scope.session, scope.tenant, added),
            )
            return {"age": self._drop_old(db), "size": self._drop_beyond(db, scope)}

    def _drop_old(self, db: sqlite3.Connection) -> int:
        """Every scope's turns older than the age bound (indexed by time: cheap when none)."""
        horizon = self._clock() - self._max_age_s
        rows = db.execute(
            "SELECT id, session, tenant, size, text FROM archive WHERE at < ?", (horizon,)
        ).fetchall()
        for row_id, session, tenant, size, text in rows:
            self._delete(db, row_id, text)
            db.execute(
                "UPDATE archive_sizes SET bytes = bytes - ? WHERE session = ? AND tenant = ?",
                (size, session, tenant),
            )
        return len(rows)

    def _drop_beyond(self, db: sqlite3.Connection, scope: Scope) -> int:
        """The scope's oldest turns until it is within the size bound."""
        key = (scope.session, scope.tenant)
        (total,) = db.execute(
            "SELECT bytes FROM archive_sizes WHERE session = ? AND tenant = ?", key
        ).fetchone()
        dropped = 0
        while total > self._max_bytes:
            rows = db.execute(
                "SELECT id, size, text FROM archive WHERE session = ? AND tenant = ?"
                " ORDER BY id LIMIT ?",
                (*key, _DROP_BATCH),
            ).fetchall()
            if not rows:
                break
            for row_id, size, text in rows:
                if total <= self._max_bytes:
                    break
                self._delete(db, row_id, text)
                total -= size
                dropped += 1
        db.execute(
            "UPDATE archive_sizes SET bytes = ? WHERE session = ? AND tenant = ?", (total, *key)
        )
        return dropped

    def _delete(self, db: sqlite3.Connection, row_id: int, text: str) -> None:
        if self.full_text:
            db.execute(
                "INSERT INTO archive_fts (archive_fts, rowid, text) VALUES ('delete', ?, ?)",
                (row_id, text),
            )
        db.execute("DELETE FROM archive WHERE id = ?", (row_id,))
        db.execute("DELETE FROM archive_owners WHERE id = ?", (row_id,))

    # -- reading ------------------------------------------------------------------------------

    async def search(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> list[Found]:
        terms = query_terms(query)
        if not terms:
            return []
        if self.full_text:
            return await self._run(lambda: self._match(session, tenant, terms, limit))
        return await self._run(lambda: self._scan(session, tenant, terms, limit))

    def _match(self, session: str, tenant: str | None, terms: list[str], limit: int) -> list[Found]:
        """bm25 order among the newest RANKED turns of the scope holding every term; when none
        does, holding any."""
        owners = self._owners(session, tenant)
        if not owners:
            return []
        marks = ", ".join("?" * len(owners))
        phrases = ['"' + term.replace('"', '""') + '"' for term in terms]
        rows: list[Any] = []
        for joiner in (" AND ", " OR "):
            rows = (
                self._db()
                .execute(
                    # Ranked and cut to `limit` before the turns are read: joined first, all
                    # RANKED turns' texts would be (6 ms instead of 3 at 100k turns).
                    f"SELECT {_COLUMNS}, best.rank FROM (SELECT id, rank FROM"
                    " (SELECT f.rowid AS id, f.rank AS rank"
                    " FROM archive_fts f JOIN archive_owners o ON o.id = f.rowid"
                    f" WHERE archive_fts MATCH ? AND o.owner IN ({marks})"
                    " ORDER BY f.rowid DESC LIMIT ?) ORDER BY rank LIMIT ?) AS best"
                    " JOIN archive a ON a.id = best.id ORDER BY best.rank",
                    (joiner.join(phrases), *owners, RANKED, limit),
                )
                .fetchall()
            )
            if rows or len(terms) == 1:
                break
        return [
            Found(_kind(kind), index, -rank, text, body, compaction_id, at)
            for index, kind, text, body, compaction_id, at, rank in rows
        ]

    def _owners(self, session: str, tenant: str | None) -> list[int]:
        if tenant is not None:
            return [owner_of(session, tenant)]
        rows = (
            self._db()
            .execute("SELECT tenant FROM archive_sizes WHERE session = ?", (session,))
            .fetchall()
        )
        return [owner_of(session, each) for (each,) in rows]

    def _scan(self, session: str, tenant: str | None, terms: list[str], limit: int) -> list[Found]:
        """Without FTS5: the session's turns holding any term, scored by the simple term score."""
        where = "session = ?" + ("" if tenant is None else " AND tenant = ?")
        params: list[object] = [session] if tenant is None else [session, tenant]
        likes = " OR ".join("text LIKE ? ESCAPE '\\'" for _ in terms)
        params += ["%" + _escape_like(term) + "%" for term in terms]
        rows = (
            self._db()
            .execute(f"SELECT {_COLUMNS} FROM archive a WHERE {where} AND ({likes})", params)
            .fetchall()
        )
        scored = [
            Found(_kind(kind), index, score_text(text, terms), text, body, compaction_id, at)
            for index, kind, text, body, compaction_id, at in rows
        ]
        scored = [found for found in scored if found.score > 0]
        scored.sort(key=lambda found: (-found.score, -(found.index or 0)))
        return scored[:limit]

    async def compactions(self, session: str, *, tenant: str | None) -> set[str]:
        where = "session = ?" + ("" if tenant is None else " AND tenant = ?")
        params = (session,) if tenant is None else (session, tenant)
        rows = await self._run(
            lambda: (
                self._db()
                .execute(f"SELECT DISTINCT compaction_id FROM archive WHERE {where}", params)
                .fetchall()
            )
        )
        return {compaction_id for (compaction_id,) in rows}


def _kind(stored: str) -> Kind:
    return "tool_output" if stored == "tool_output" else "message"


def _escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
