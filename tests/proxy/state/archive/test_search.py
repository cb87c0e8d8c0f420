"""One search over the archive and the session's memory items; the `recall` command."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import orjson
import pytest

from proxy.cli import main
from proxy.state.archive import Scope, search_session
from proxy.state.archive.local import LocalArchive
from proxy.state.archive.sqlite import SqliteArchive
from proxy.state.sqlite_file import StateFile
from tests.proxy.state.archive.conftest import entry

ALICE = Scope("agent-1", "aa" * 16)
MALLORY = Scope("agent-1", "bb" * 16)


def write_memory(memory_dir: Path, session: str, items: list[tuple[str, str, str]]) -> None:
    folder = memory_dir / session
    folder.mkdir(parents=True)
    lines = [
        orjson.dumps({"type": kind, "content": content, "session_id": session,
                      "compaction_id": compaction_id, "timestamp": "2026-11-27T08:00:00+00:00"})
        for kind, content, compaction_id in items
    ]  # fmt: skip
    (folder / "compaction_flush.jsonl").write_bytes(b"\n".join([*lines, b"not json"]) + b"\n")


async def test_memory_items_are_found_beside_archived_turns_and_scoped_by_credential(
    tmp_path: Path,
) -> None:
    archive = LocalArchive(max_bytes=1 << 20, max_age_s=86400, clock=lambda: 1_000_000.0)
    await archive.add(ALICE, [entry(7, "we chose postgres for the ledger", compaction_id="ca")])
    await archive.add(MALLORY, [entry(2, "unrelated", compaction_id="cm")])
    write_memory(
        tmp_path,
        "agent-1",
        [
            ("decision", "use postgres 16 for the ledger service", "ca"),
            ("fact", "mallory's postgres password rotation is weekly", "cm"),
        ],
    )
    mine = await search_session(
        archive, tmp_path, "agent-1", "postgres ledger", tenant=ALICE.tenant, limit=10
    )
    assert [(item.kind, item.index) for item in mine] == [("message", 7), ("memory", None)]
    assert mine[1].text == "decision: use postgres 16 for the ledger service"
    every = await search_session(archive, tmp_path, "agent-1", "postgres", tenant=None, limit=10)
    assert sum(item.kind == "memory" for item in every) == 2
    assert (
        await search_session(archive, tmp_path, "agent-2", "postgres", tenant=None, limit=10) == []
    )


async def archive_into(state: Path) -> None:
    archive = SqliteArchive(StateFile(state), max_bytes=1 << 20, max_age_s=86400 * 365 * 100)
    await archive.open()
    await archive.add(
        ALICE, [entry(12, "the deploy key lives in vault path kv/deploy", kind="tool_output")]
    )
    await archive.close()


def test_the_recall_command_prints_the_best_matches_of_the_state_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.sqlite3"
    asyncio.run(archive_into(state))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"state:\n  backend: sqlite\n  path: {state}\nmemory:\n  dir: {tmp_path / 'memory'}\n"
    )
    assert main(["--config", str(config), "recall", "agent-1", "vault deploy", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "1. turn 12 · tool_output" in out and "kv/deploy" in out
    assert main(["--config", str(config), "recall", "agent-1", "nothing-like-this"]) == 0
    assert "no archived turn or memory item" in capsys.readouterr().out
    assert main(["--config", str(config), "recall", "../etc", "x"]) == 2


def test_the_recall_command_only_reads_the_state_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It runs beside a live proxy: it opens the file read-only (a writer closing the database
    last would checkpoint it and delete the proxy's -wal), so it creates nothing in it."""
    state = tmp_path / "state.sqlite3"
    with sqlite3.connect(state) as connection:
        connection.execute("CREATE TABLE checkpoints (key BLOB PRIMARY KEY)")
    connection.close()
    config = tmp_path / "config.yaml"
    config.write_text(f"state:\n  backend: sqlite\n  path: {state}\n")
    assert main(["--config", str(config), "recall", "agent-1", "vault"]) == 1
    assert "could not be searched" in capsys.readouterr().err
    with sqlite3.connect(state) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master")}
    connection.close()
    assert tables == {"checkpoints", "sqlite_autoindex_checkpoints_1"}
