"""The SQLite file under faults, with real files: deleted while in use (its rows land in a new
one), corrupt (moved aside under a timestamped name, a new one started), forwarded marks written
back with their checkpoints after an outage, and a file that shrinks once pruned."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from compaction.checkpoints import conversation_seed, prefix_digests
from proxy.metrics import StateMetrics
from proxy.state.guard import Guarded
from proxy.state.local import LocalStore
from proxy.tasks import BackgroundTasks
from tests import factories as f
from tests.proxy.state.test_stores import DIGESTS, _checkpoint, _sqlite

REPLACED = "compaction_proxy_state_files_replaced_total"


def _replaced(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value(REPLACED, {"reason": reason}) or 0.0


def _said(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and word in record.getMessage()
    ]


def _size(path: Path) -> int:
    return sum(
        Path(f"{path}{suffix}").stat().st_size
        for suffix in ("", "-wal")
        if Path(f"{path}{suffix}").exists()
    )


@pytest.mark.parametrize("deleted", [("",), ("", "-wal", "-shm")], ids=["file", "with-its-log"])
async def test_a_state_file_deleted_while_in_use_is_said_once_and_its_rows_survive_a_restart(
    deleted: tuple[str, ...], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    registry = CollectorRegistry()
    store = _sqlite(path, now, metrics=StateMetrics(registry))
    await store.open()
    await store.put(_checkpoint(3))
    assert await store.mark_forwarded("c3")
    for suffix in deleted:
        Path(f"{path}{suffix}").unlink()
    await store.put(_checkpoint(7))
    await store.put(_checkpoint(9))
    await store.close()

    assert _replaced(registry, "vanished") == 1
    assert len(_said(caplog, "vanished")) == 1
    again = _sqlite(path, now)
    await again.open()
    assert await again.longest(DIGESTS[:6]) == _checkpoint(3)
    assert await again.longest(DIGESTS[:8]) == _checkpoint(7)
    assert await again.longest(DIGESTS) == _checkpoint(9)
    assert not await again.mark_forwarded("c3")  # already forwarded before the deletion
    await again.close()


async def _damage(path: Path, how: str) -> bytes:
    """A file that is not a database at all, or one whose pages past the first are overwritten
    (SQLite's header reads; its tables do not)."""
    if how == "not-a-database":
        path.write_bytes(b"this is not a database\n" * 512)
    else:
        store = _sqlite(path, [1000.0])
        await store.open()
        for cut in range(1, 13):
            await store.put(_checkpoint(cut, "y" * 3000))
        await store.close()
        with path.open("r+b") as file:
            file.seek(4096)
            file.write(b"\xff" * (path.stat().st_size - 4096))
    return path.read_bytes()


@pytest.mark.parametrize("how", ["not-a-database", "malformed"])
async def test_a_corrupt_state_file_is_moved_aside_and_a_new_one_started(
    how: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]  # 1970-01-01T00:16:40Z
    path = tmp_path / "state.sqlite3"
    damaged = await _damage(path, how)
    registry = CollectorRegistry()
    metrics = StateMetrics(registry)
    store = _sqlite(path, now, metrics=metrics)
    await store.open()
    await store.put(_checkpoint(3))
    assert await store.longest(DIGESTS) == _checkpoint(3)
    await store.close()

    aside = tmp_path / "state.sqlite3.corrupt-19700101T001640Z"
    assert aside.stat().st_size == len(damaged)
    if how == "not-a-database":
        assert aside.read_bytes() == damaged
    assert _replaced(registry, "corrupt") == 1
    assert len(_said(caplog, "corrupt")) == 1
    again = _sqlite(path, now, metrics=metrics)
    await again.open()
    assert await again.longest(DIGESTS) == _checkpoint(3)
    await again.close()
    assert _replaced(registry, "corrupt") == 1
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == [aside.name]
    with pytest.raises(sqlite3.DatabaseError), sqlite3.connect(aside) as connection:
        connection.execute("SELECT count(*) FROM checkpoints").fetchall()  # still the damaged one


async def test_forwarded_marks_are_written_back_with_their_checkpoints_after_an_outage(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    tasks = BackgroundTasks()
    store = _sqlite(path, now)
    guard = Guarded(
        store,
        LocalStore(100, 60),
        StateMetrics(CollectorRegistry()),
        tasks,
        timeout_s=5,
        retry_s=5,
        clock=lambda: now[0],
    )
    await guard.open()
    # Another writer holds the file past SQLite's busy timeout: writes fail, as on a full disk.
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    await guard.put(_checkpoint(7))
    assert guard.degraded
    assert await guard.mark_forwarded("c7")  # sent while the file refused writes
    locker.rollback()
    locker.close()

    now[0] += 6  # past retry_s: the next call finds the file back and writes back
    assert await guard.longest(DIGESTS) == _checkpoint(7)
    for _ in range(200):
        with sqlite3.connect(path) as connection:
            rows = connection.execute("SELECT count(*) FROM forwarded").fetchone()[0]
        if rows:
            break
        await asyncio.sleep(0.02)
    await guard.close()
    await tasks.close()

    again = _sqlite(path, now)
    await again.open()
    assert await again.longest(DIGESTS) == _checkpoint(7)
    assert not await again.mark_forwarded("c7")  # a restart still knows it went out
    await again.close()


async def test_the_state_file_shrinks_once_its_rows_are_pruned(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "state.sqlite3"
    store = _sqlite(path, now, max_entries=1000, ttl_s=60.0)
    await store.open()
    conversations = [
        prefix_digests([f.system(), f.user("q")], conversation_seed(str(i))) for i in range(300)
    ]
    await asyncio.gather(
        *(store.put(_checkpoint(2, "x" * 8000, digests)) for digests in conversations)
    )
    full = _size(path)
    assert full > 300 * 8000

    now[0] += 61  # every row expired: the next commit prunes them
    await store.put(_checkpoint(3))
    await store.put(_checkpoint(4))  # committed on the writer thread after the first's vacuum
    assert _size(path) < full / 4
    await store.close()
    assert _size(path) < full / 4
