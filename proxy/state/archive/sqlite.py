"""The archive in the state file (`state.backend: sqlite`), with an FTS5 full-text index in the
same file; where this SQLite lacks FTS5, a scan of the session's turns, said once in the log.

Every statement runs through the state file's one connection, on its thread
(proxy.state.sqlite_file), so the event loop never waits for the disk. The archive follows the
file its path names: when the file is deleted, moved aside as corrupt, or another is put in its
place, the next statement works in the new file. What only the old file held is not copied over:
the archive can be far larger than the store's rows, and a recall that finds less is a loss,
never an error.

Best first, from the index alone (one statement, cut to `limit` in SQL before a turn is read):
the newest turns of the scope that hold every word of the query; when none holds all, those that
hold the most of them among each word's newest RANKED, newest first at equal count. FTS5's bm25
is not used: before it ranks a single row it counts every turn holding each word (0.5-2.5 ms at
100k turns for common words, more than the rest of a search); the newest turn holding the words
is also what a model asking about "the" error or "the" path most often means.

A search walks the index's matches newest first and keeps those of its session (and credential)
until it has enough: it never returns another scope's turns. (A scope token in the index,
intersected with the words, cost ten times more: its list holds every turn of the session.)

Bounds, applied as turns are added, in one transaction with them: a scope's turns older than
`max_age_s` and its oldest beyond `max_bytes`; then, while all scopes together weigh more than
`max_total_bytes`, the least recently archived scope goes whole (its turns, their index rows,
its compactions), so no partial archive is left that recall would search in vain. A turn weighs
what it is stored in (its JSON and text compressed together, `Entry.size`, in the `body`
column; `text` is left empty) plus what its rows in the owners table and the full-text index
take (`weight`): the bound holds for the file, whose pages freed are given back (incremental
vacuum, proxy.state.sqlite_file). A file written before turns were compressed keeps its rows
(`body` the JSON as text, `text` the text) and its full-text index over the table (one made
since holds no text of its own: `content=''`); both are read alike (`_turn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence

from proxy.state.archive.entries import Entry, Found, Kind, Scope, unpack
from proxy.state.archive.terms import count_words, query_terms, score_text
from proxy.state.sqlite_file import StateFile, vacuum

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
    " bytes INTEGER NOT NULL, at REAL NOT NULL DEFAULT 0, PRIMARY KEY (session, tenant))",
)
# When each scope last archived (the total bound drops the least recent first). A file from
# before it gets the column, filled from its turns.
_SCOPE_TIMES = (
    "ALTER TABLE archive_sizes ADD COLUMN at REAL NOT NULL DEFAULT 0",
    "UPDATE archive_sizes SET at = coalesce((SELECT max(a.at) FROM archive a"
    " WHERE a.session = archive_sizes.session AND a.tenant = archive_sizes.tenant), 0)",
)
_SCOPE_ORDER = "CREATE INDEX IF NOT EXISTS archive_sizes_at ON archive_sizes (at)"
# The compactions whose turns each scope archived (read at every recall: listing them from the
# turns read every turn of the session). A file from before it gets it filled once.
_COMPACTIONS = (
    "CREATE TABLE archive_compactions (session TEXT NOT NULL, tenant TEXT NOT NULL,"
    " compaction_id TEXT NOT NULL, PRIMARY KEY (session, tenant, compaction_id)) WITHOUT ROWID",
    "INSERT OR IGNORE INTO archive_compactions"
    " SELECT DISTINCT session, tenant, compaction_id FROM archive",
)
_INDEX = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS archive_fts USING fts5(text,"
    " content='', tokenize='unicode61 remove_diacritics 2')"
)
_COLUMNS = "a.idx, a.kind, a.text, a.body, a.compaction_id, a.at"
RANKED = 200
"""When no turn holds every word: how many of each word's newest turns are counted."""


@functools.lru_cache(maxsize=64)
def _every_word(owners: int) -> str:
    """The statement finding the newest turns that hold every word (one text per owner count,
    so SQLite's statement cache prepares it once)."""
    marks = ", ".join("?" * owners)
    return (
        f"SELECT {_COLUMNS} FROM (SELECT f.rowid AS id FROM archive_fts f"
        " JOIN archive_owners o ON o.id = f.rowid"
        f" WHERE archive_fts MATCH ? AND o.owner IN ({marks})"
        " ORDER BY f.rowid DESC LIMIT ?) AS best JOIN archive a ON a.id = best.id"
        " ORDER BY best.id DESC"
    )


@functools.lru_cache(maxsize=256)
def _most_words(owners: int, words: int) -> str:
    """The statement finding the turns that hold the most words, each word's newest RANKED
    counted (parameters: per word its phrase, the owners and RANKED; then the limit)."""
    marks = ", ".join("?" * owners)
    each = (
        "SELECT * FROM (SELECT f.rowid AS id FROM archive_fts f"
        " JOIN archive_owners o ON o.id = f.rowid"
        f" WHERE archive_fts MATCH ? AND o.owner IN ({marks}) ORDER BY f.rowid DESC LIMIT ?)"
    )
    hits = " UNION ALL ".join([each] * words)
    return (
        f"SELECT {_COLUMNS}, best.held FROM (SELECT id, count(*) AS held FROM ({hits})"
        " GROUP BY id ORDER BY held DESC, id DESC LIMIT ?) AS best"
        " JOIN archive a ON a.id = best.id ORDER BY best.held DESC, best.id DESC"
    )


def owner_of(session: str, tenant: str) -> int:
    """The session and credential as one signed 64-bit integer (a digest's first 8 bytes)."""
    digest = hashlib.sha256(f"{tenant}\x00{session}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Dropping the oldest beyond the size bound reads them this many at a time.
_DROP_BATCH = 256
# What a turn's rows besides its packed JSON and text take, measured (bench.archive --sessions):
# its row's other columns, its owner row, its entries in the table's indexes; and the full-text
# index's postings, per distinct word of its text (5.2-5.5 bytes once merged whole, on the corpus
# and on tests/proxy/state/archive/test_total_bound.py's turns; more in segments not yet merged).
_ROW_BYTES = 160
_WORD_BYTES = 6
# The share of a turn's weight its rows take: the rest is its part of the full-text index's
# room between merges (deletion marks, a merge's output before its inputs are freed:
# up to a quarter more than the turns' weight with many distinct identifiers, measured as above).
_HEADROOM = 0.8
_PAGE_FILL = 0.85  # how full a leaf page of the table is
# Pages of the full-text index merged after turns were dropped (sqlite.org/fts5.html, 6.9:
# negative: every segment taken as one level, so deletion marks meet what they delete).
_MERGE_PAGES = 256


class ArchiveTables:
    """The archive's tables in the state file (proxy.state.sqlite_file.Tables), made on the
    file's thread at each connection; whether the full-text index is there."""

    carried: tuple[str, ...] = ()

    def __init__(self, *, full_text: bool) -> None:
        self._want_full_text = full_text
        self.full_text = False

    def create(self, connection: sqlite3.Connection, *, read_only: bool) -> None:
        if read_only:
            names = {name for (name,) in connection.execute("SELECT name FROM sqlite_master")}
            if "archive" not in names:
                raise sqlite3.OperationalError("the state file holds no archive")
            self.full_text = self._want_full_text and "archive_fts" in names
            return
        for statement in _TABLE:
            connection.execute(statement)
        columns = {row[1] for row in connection.execute("PRAGMA table_info(archive_sizes)")}
        if "at" not in columns:
            for statement in _SCOPE_TIMES:
                connection.execute(statement)
        connection.execute(_SCOPE_ORDER)
        if not connection.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'archive_compactions'"
        ).fetchone():
            for statement in _COMPACTIONS:
                connection.execute(statement)
        self.full_text = False
        if self._want_full_text:
            try:
                connection.execute(_INDEX)
                self.full_text = True
            except sqlite3.OperationalError as exc:
                log.warning(
                    "archive search without a full-text index (this SQLite has no FTS5): a scan",
                    extra={"error": str(exc)},
                )

    def prune(self, connection: sqlite3.Connection, now: float) -> None:
        return None  # the bounds are applied as turns are added (SqliteArchive.add)

    def load(self, connection: sqlite3.Connection) -> None:
        return None


class SqliteArchive:
    name = "sqlite"

    def __init__(
        self,
        file: StateFile,
        *,
        max_bytes: int,
        max_age_s: float,
        max_total_bytes: int | None = None,
        full_text: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Over `file`, the process's one connection to the state file (read-only: a reader
        beside a running proxy). At most `max_bytes` per scope, `max_total_bytes` over all of
        them (None: no bound but the age). `full_text=False` searches by a scan even where FTS5
        exists (how the fallback is tested)."""
        self.path = file.path
        self._max_bytes = max_bytes
        self._max_total_bytes = max_total_bytes
        self._max_age_s = max_age_s
        self._clock = clock
        self._tables = ArchiveTables(full_text=full_text)
        self._file = file
        file.attach(self._tables)

    @property
    def full_text(self) -> bool:
        return self._tables.full_text

    def weight(self, entry: Entry) -> int:
        """What a turn takes in the file: its row (`Entry.size`, what its last overflow page
        leaves empty), its index rows, and its part of the room the index needs between
        merges."""
        row = entry.size + _ROW_BYTES
        index = _WORD_BYTES * count_words(entry.text)
        return int((row / _PAGE_FILL + index + _overflow_slack(row)) / _HEADROOM)

    async def open(self) -> None:
        await self._file.open()

    async def close(self) -> None:
        await self._file.close()

    # -- writing ------------------------------------------------------------------------------

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        # Weighed in a thread of their own: the file's thread is the checkpoints' too.
        sizes = await asyncio.to_thread(lambda: [self.weight(entry) for entry in entries])
        return await self._file.run(lambda db: self._add(db, scope, entries, sizes))

    def _add(
        self, db: sqlite3.Connection, scope: Scope, entries: Sequence[Entry], sizes: list[int]
    ) -> dict[str, int]:
        with db:  # one transaction
            db.execute("BEGIN IMMEDIATE")
            # Room made before the new turns go in: the file never holds both.
            dropped = {
                "age": self._drop_old(db),
                "total": self._drop_over_total(db, scope, room=sum(sizes)),
            }
            added = 0
            for entry, size in zip(entries, sizes, strict=True):
                cursor = db.execute(
                    "INSERT OR IGNORE INTO archive (session, tenant, idx, dialect, kind,"
                    " compaction_id, at, size, body, text)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (scope.session, scope.tenant, entry.index, entry.dialect, entry.kind,
                     entry.compaction_id, entry.at, size, entry.packed, ""),
                )  # fmt: skip
                if cursor.rowcount != 1:
                    continue
                added += size
                db.execute(
                    "INSERT INTO archive_owners (id, owner) VALUES (?, ?)",
                    (cursor.lastrowid, owner_of(scope.session, scope.tenant)),
                )
                if self.full_text:
                    db.execute(
                        "INSERT INTO archive_fts (rowid, text) VALUES (?, ?)",
                        (cursor.lastrowid, entry.text),
                    )
            db.executemany(
                "INSERT OR IGNORE INTO archive_compactions (session, tenant, compaction_id)"
                " VALUES (?, ?, ?)",
                {(scope.session, scope.tenant, entry.compaction_id) for entry in entries},
            )
            db.execute(
                "INSERT INTO archive_sizes (session, tenant, bytes, at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (session, tenant) DO UPDATE SET bytes = bytes + excluded.bytes,"
                " at = excluded.at",
                (scope.session, scope.tenant, added, self._clock()),
            )
            dropped["size"] = self._drop_beyond(db, scope.session, scope.tenant, self._max_bytes)
            # Alone over the bound (every other scope gone): its own oldest turns.
            dropped["total"] += self._drop_over_total(db, scope, room=0)
            if any(dropped.values()) and self.full_text:
                # What the index forgot stays in it as deletion marks until its segments are
                # merged: merge some now, so the index shrinks as the table does.
                db.execute(
                    "INSERT INTO archive_fts (archive_fts, rank) VALUES ('merge', ?)",
                    (-_MERGE_PAGES,),
                )
        if any(dropped.values()):
            # The pages freed go back to the file system now; the turns are written whatever
            # this says (a full disk refuses the vacuum, not the archive).
            with contextlib.suppress(sqlite3.Error):
                vacuum(db, shrink=True)
        return dropped

    def _drop_old(self, db: sqlite3.Connection) -> int:
        """Every scope's turns older than the age bound (indexed by time: cheap when none)."""
        horizon = self._clock() - self._max_age_s
        rows = db.execute(
            "SELECT id, session, tenant, size, body, text FROM archive WHERE at < ?", (horizon,)
        ).fetchall()
        for row_id, session, tenant, size, body, text in rows:
            self._delete(db, row_id, body, text)
            db.execute(
                "UPDATE archive_sizes SET bytes = bytes - ? WHERE session = ? AND tenant = ?",
                (size, session, tenant),
            )
        if rows:  # scopes left empty go whole, their compactions with them
            for session, tenant in db.execute(
                "SELECT session, tenant FROM archive_sizes WHERE bytes <= 0"
            ).fetchall():
                self._forget(db, session, tenant)
        return len(rows)

    def _drop_beyond(self, db: sqlite3.Connection, session: str, tenant: str, bound: int) -> int:
        """The scope's oldest turns until it weighs at most `bound`."""
        key = (session, tenant)
        (total,) = db.execute(
            "SELECT bytes FROM archive_sizes WHERE session = ? AND tenant = ?", key
        ).fetchone()
        dropped = 0
        while total > bound:
            rows = db.execute(
                "SELECT id, size, body, text FROM archive WHERE session = ? AND tenant = ?"
                " ORDER BY id LIMIT ?",
                (*key, _DROP_BATCH),
            ).fetchall()
            if not rows:
                break
            for row_id, size, body, text in rows:
                if total <= bound:
                    break
                self._delete(db, row_id, body, text)
                total -= size
                dropped += 1
        db.execute(
            "UPDATE archive_sizes SET bytes = ? WHERE session = ? AND tenant = ?", (total, *key)
        )
        return dropped

    def _drop_over_total(self, db: sqlite3.Connection, scope: Scope, *, room: int) -> int:
        """While every scope together and `room` weigh more than the total bound: the least
        recently archived scope whole (`scope`, the one being written, last of all: its oldest
        turns)."""
        if self._max_total_bytes is None:
            return 0
        (total,) = db.execute("SELECT total(bytes) FROM archive_sizes").fetchone()
        total += room
        dropped = 0
        while total > self._max_total_bytes:
            oldest = db.execute(
                "SELECT session, tenant, bytes FROM archive_sizes"
                " WHERE NOT (session = ? AND tenant = ?) ORDER BY at LIMIT 1",
                (scope.session, scope.tenant),
            ).fetchone()
            if oldest is None:
                own = db.execute(
                    "SELECT bytes FROM archive_sizes WHERE session = ? AND tenant = ?",
                    (scope.session, scope.tenant),
                ).fetchone()
                if own is None:  # nothing archived but what comes: it is kept as it is
                    return dropped
                excess = int(total) - self._max_total_bytes
                return dropped + self._drop_beyond(
                    db, scope.session, scope.tenant, max(0, own[0] - excess)
                )
            session, tenant, size = oldest
            for row_id, body, text in db.execute(
                "SELECT id, body, text FROM archive WHERE session = ? AND tenant = ?",
                (session, tenant),
            ).fetchall():
                self._delete(db, row_id, body, text)
                dropped += 1
            self._forget(db, session, tenant)
            total -= size
        return dropped

    def _forget(self, db: sqlite3.Connection, session: str, tenant: str) -> None:
        """A scope without turns: its size and its compactions go."""
        db.execute("DELETE FROM archive_sizes WHERE session = ? AND tenant = ?", (session, tenant))
        db.execute(
            "DELETE FROM archive_compactions WHERE session = ? AND tenant = ?", (session, tenant)
        )

    def _delete(self, db: sqlite3.Connection, row_id: int, body: bytes | str, text: str) -> None:
        if self.full_text:  # the index forgets a row given the text it indexed
            db.execute(
                "INSERT INTO archive_fts (archive_fts, rowid, text) VALUES ('delete', ?, ?)",
                (row_id, _turn(body, text)[1]),
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
        return await self._file.run(lambda db: self._found(db, session, tenant, terms, limit))

    def _found(
        self, db: sqlite3.Connection, session: str, tenant: str | None, terms: list[str],
        limit: int,
    ) -> list[Found]:  # fmt: skip
        if self.full_text:
            return self._match(db, session, tenant, terms, limit)
        return self._scan(db, session, tenant, terms, limit)

    def _match(
        self, db: sqlite3.Connection, session: str, tenant: str | None, terms: list[str],
        limit: int,
    ) -> list[Found]:  # fmt: skip
        """The newest turns holding every term; when none does, those holding the most. The
        score: how many of the query's terms a turn holds."""
        owners = self._owners(db, session, tenant)
        if not owners:
            return []
        phrases = ['"' + term.replace('"', '""') + '"' for term in terms]
        every = db.execute(
            _every_word(len(owners)), (" AND ".join(phrases), *owners, limit)
        ).fetchall()
        if every or len(terms) == 1:
            held = float(len(terms))
            return [
                _found(index, kind, held, body, text, compaction_id, at)
                for index, kind, text, body, compaction_id, at in every
            ]
        parameters: list[object] = []
        for phrase in phrases:
            parameters += [phrase, *owners, RANKED]
        most = db.execute(_most_words(len(owners), len(terms)), (*parameters, limit)).fetchall()
        return [
            _found(index, kind, float(count), body, text, compaction_id, at)
            for index, kind, text, body, compaction_id, at, count in most
        ]

    def _owners(self, db: sqlite3.Connection, session: str, tenant: str | None) -> list[int]:
        if tenant is not None:
            return [owner_of(session, tenant)]
        rows = db.execute(
            "SELECT tenant FROM archive_sizes WHERE session = ?", (session,)
        ).fetchall()
        return [owner_of(session, each) for (each,) in rows]

    def _scan(
        self, db: sqlite3.Connection, session: str, tenant: str | None, terms: list[str],
        limit: int,
    ) -> list[Found]:  # fmt: skip
        """Without FTS5: the session's turns, each scored by the simple term score (their text
        is compressed: read here, not by a LIKE)."""
        where = "session = ?" + ("" if tenant is None else " AND tenant = ?")
        params = (session,) if tenant is None else (session, tenant)
        scored = []
        for index, kind, stored_text, body, compaction_id, at in db.execute(
            f"SELECT {_COLUMNS} FROM archive a WHERE {where}", params
        ):
            message, text = _turn(body, stored_text)
            score = score_text(text, terms)
            if score > 0:
                scored.append(Found(_kind(kind), index, score, text, message, compaction_id, at))
        scored.sort(key=lambda found: (-found.score, -(found.index or 0)))
        return scored[:limit]

    async def find(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> tuple[list[Found], set[str] | None]:
        terms = query_terms(query)

        def both(db: sqlite3.Connection) -> tuple[list[Found], set[str] | None]:
            found = self._found(db, session, tenant, terms, limit) if terms else []
            return found, None if tenant is None else self._compactions(db, session, tenant)

        return await self._file.run(both)

    async def compactions(self, session: str, *, tenant: str | None) -> set[str]:
        return await self._file.run(lambda db: self._compactions(db, session, tenant))

    def _compactions(self, db: sqlite3.Connection, session: str, tenant: str | None) -> set[str]:
        where = "session = ?" + ("" if tenant is None else " AND tenant = ?")
        params = (session,) if tenant is None else (session, tenant)
        rows = db.execute(f"SELECT compaction_id FROM archive_compactions WHERE {where}", params)
        return {compaction_id for (compaction_id,) in rows}


def _overflow_slack(payload: int) -> int:
    """The bytes a row of `payload` bytes leaves empty on its last overflow page, on pages of
    4 KiB (sqlite.org/fileformat2.html, 1.6: a payload beyond U-35 keeps M + (P-M) % (U-4) on
    its leaf when that fits, else M, and the rest on overflow pages of U-4 bytes each)."""
    usable, most = 4096, 4096 - 35
    if payload <= most:
        return 0
    least = (usable - 12) * 32 // 255 - 23
    local = least + (payload - least) % (usable - 4)
    if local > most:
        local = least
    overflow = payload - local
    return -overflow % (usable - 4)


def _kind(stored: str) -> Kind:
    return "tool_output" if stored == "tool_output" else "message"


def _turn(body: bytes | str, text: str) -> tuple[str, str]:
    """A row's JSON and text: packed together (bytes), or each as it is (a row written before
    turns were compressed)."""
    return unpack(body) if isinstance(body, bytes) else (body, text)


def _found(
    index: int, kind: str, score: float, body: bytes | str, text: str, compaction_id: str,
    at: float,
) -> Found:  # fmt: skip
    message, words = _turn(body, text)
    return Found(_kind(kind), index, score, words, message, compaction_id, at)
