"""The SQLite archive and the state file it shares with the state store (one connection): it
follows the file its path names when that file is deleted, moved aside or replaced, the store's
rows carried into the new file, it creates the file private to the proxy's user, and it finds
the newest turns first."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from proxy.state.archive import Scope
from proxy.state.archive.sqlite import SqliteArchive, owner_of
from proxy.state.sqlite_file import StateFile
from tests.proxy.state.archive.conftest import entry
from tests.proxy.state.test_stores import DIGESTS, _checkpoint, _sqlite

ALICE = Scope("agent-1", "aa" * 16)


def _archived(path: Path) -> list[int]:
    """The indexes archived in the file at `path`, read by a connection of its own."""
    with sqlite3.connect(path) as connection:
        return sorted(index for (index,) in connection.execute("SELECT idx FROM archive"))


def _archive(path: Path | StateFile) -> SqliteArchive:
    file = path if isinstance(path, StateFile) else StateFile(path, clock=lambda: 1_000_000.0)
    return SqliteArchive(file, max_bytes=1 << 20, max_age_s=1e9, clock=lambda: 1_000_000.0)


@pytest.mark.parametrize("how", ["deleted", "moved-aside", "replaced"])
async def test_the_archive_follows_a_state_file_deleted_moved_or_replaced_while_it_runs(
    how: str, tmp_path: Path
) -> None:
    path = tmp_path / "state.sqlite3"
    archive = _archive(path)
    await archive.open()
    await archive.add(ALICE, [entry(1, "before the swap: amber falcon")])
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    elif how == "moved-aside":
        path.rename(tmp_path / "state.sqlite3.corrupt-x")
    else:  # an operator restores another file in its place
        other = tmp_path / "restored.sqlite3"
        sqlite3.connect(other).close()
        os.replace(other, path)

    await archive.add(ALICE, [entry(2, "after the swap: cobalt heron")])
    found = await archive.search("agent-1", "cobalt heron", tenant=ALICE.tenant, limit=5)
    assert [item.index for item in found] == [2]
    # The old file's turns are not carried over: the path's file holds what came after.
    assert await archive.search("agent-1", "amber falcon", tenant=None, limit=5) == []
    await archive.close()
    assert _archived(path) == [2]


async def test_the_state_store_keeps_its_new_file_whole_when_the_archive_follows_it(
    tmp_path: Path,
) -> None:
    """The store and the archive work through one connection: whichever finds the file gone
    first starts the new one with the store's rows, and the other goes on in it."""
    path = tmp_path / "state.sqlite3"
    now = [1000.0]
    store = _sqlite(path, now)
    archive = _archive(store.file)
    await store.open()
    await archive.open()
    await store.put(_checkpoint(3))
    await archive.add(ALICE, [entry(1, "first turn")])
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)

    await archive.add(ALICE, [entry(2, "second turn")])  # the new file, with the store's rows
    await store.put(_checkpoint(5))
    await store.put(_checkpoint(7))
    await archive.add(ALICE, [entry(3, "third turn")])
    assert Path(f"{path}-wal").exists()
    await archive.close()
    await store.close()

    again = _sqlite(path, now)
    await again.open()
    assert await again.longest(DIGESTS[:4]) == _checkpoint(3)
    assert await again.longest(DIGESTS[:8]) == _checkpoint(7)
    await again.close()
    assert _archived(path) == [2, 3]


async def test_the_archive_creates_the_state_file_private_to_the_proxy_user(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "state.sqlite3"
    archive = _archive(path)
    await archive.open()
    await archive.add(ALICE, [entry(1, "a user's words, verbatim")])
    await archive.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


async def test_among_turns_holding_every_word_the_newest_comes_first(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "state.sqlite3")
    await archive.open()
    await archive.add(ALICE, [entry(i, f"deploy region was eu-west-{i}") for i in range(1, 30)])
    found = await archive.search("agent-1", "deploy region", tenant=ALICE.tenant, limit=3)
    assert [item.index for item in found] == [29, 28, 27]


async def test_a_file_from_before_the_compactions_table_gets_it_filled(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    archive = _archive(path)
    await archive.open()
    await archive.add(ALICE, [entry(1, "older turn", compaction_id="c-old")])
    await archive.close()
    with sqlite3.connect(path) as connection:
        connection.execute("DROP TABLE archive_compactions")
    again = _archive(path)
    await again.open()
    assert await again.compactions("agent-1", tenant=ALICE.tenant) == {"c-old"}
    await again.close()


async def test_a_file_from_before_turns_were_compressed_opens_and_is_bounded_whole(
    tmp_path: Path,
) -> None:
    """The tables as the version before the total bound wrote them: a turn's JSON as text,
    sizes without the time each scope last archived."""
    path = tmp_path / "state.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """
            CREATE TABLE archive (id INTEGER PRIMARY KEY, session TEXT NOT NULL,
              tenant TEXT NOT NULL, idx INTEGER NOT NULL, dialect TEXT NOT NULL,
              kind TEXT NOT NULL, compaction_id TEXT NOT NULL, at REAL NOT NULL,
              size INTEGER NOT NULL, body TEXT NOT NULL, text TEXT NOT NULL,
              UNIQUE (session, tenant, idx));
            CREATE TABLE archive_owners (id INTEGER PRIMARY KEY, owner INTEGER NOT NULL);
            CREATE TABLE archive_sizes (session TEXT NOT NULL, tenant TEXT NOT NULL,
              bytes INTEGER NOT NULL, PRIMARY KEY (session, tenant));
            CREATE VIRTUAL TABLE archive_fts USING fts5(text, content='archive',
              content_rowid='id', tokenize='unicode61 remove_diacritics 2');
            """
        )
        text = "the old turn names quokka-7"
        body = '{"role":"user","content":"the old turn names quokka-7"}'
        connection.execute(
            "INSERT INTO archive VALUES (1, 'agent-1', ?, 4, 'chat', 'message', 'c-old',"
            " 999000.0, ?, ?, ?)",
            (ALICE.tenant, len(body) + len(text), body, text),
        )
        connection.execute(
            "INSERT INTO archive_owners VALUES (1, ?)", (owner_of("agent-1", ALICE.tenant),)
        )
        connection.execute("INSERT INTO archive_fts (rowid, text) VALUES (1, ?)", (text,))
        connection.execute(
            "INSERT INTO archive_sizes VALUES ('agent-1', ?, ?)",
            (ALICE.tenant, len(body) + len(text)),
        )
    turns = [entry(i, "new " + "y" * 900) for i in range(4)]
    weighs = sum(_archive(tmp_path / "probe.sqlite3").weight(turn) for turn in turns)
    file = StateFile(path, clock=lambda: 1_000_000.0)
    archive = SqliteArchive(
        file, max_bytes=1 << 20, max_age_s=1e9, max_total_bytes=weighs + 10,
        clock=lambda: 1_000_000.0,
    )  # fmt: skip
    await archive.open()
    (found,) = await archive.search("agent-1", "quokka", tenant=ALICE.tenant, limit=5)
    assert found.index == 4 and found.body == body
    # The old scope archived at 999,000: the least recent, it goes whole past the bound.
    later = Scope("agent-2", "aa" * 16)
    dropped = await archive.add(later, turns)
    assert dropped["total"] == 1
    assert await archive.search("agent-1", "quokka", tenant=None, limit=5) == []
    assert len(await archive.search("agent-2", "new", tenant=None, limit=5)) == 4
    await archive.close()
