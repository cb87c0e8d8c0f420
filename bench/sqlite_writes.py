"""What writing the SQLite state file costs the event loop, and what batching buys.

The store writes from one thread, each `put` joining the rows already waiting in one transaction.
Measured against the same rows written on the event loop with plain `sqlite3` (what a store
without the thread would do): the longest stall of a 1 ms ticker running beside the writes, and
the time for N checkpoints written one after another and all at once.

    .venv/bin/python -m bench.sqlite_writes [--count 500]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry

from compaction.checkpoints import Checkpoint, conversation_seed, prefix_digests
from compaction.marker import SUMMARY_MARKER
from proxy.metrics import StateMetrics
from proxy.state.sqlite import SqliteStore
from proxy.state.sqlite_file import StateFile

SUMMARY = f"{SUMMARY_MARKER}\n" + "## Decisions\n- keep the standard library only\n" * 60


def checkpoints(count: int) -> list[Checkpoint]:
    found = []
    for i in range(count):
        digests = prefix_digests([{"role": "user", "content": "q"}] * 3, conversation_seed(str(i)))
        summary = {"role": "user", "content": SUMMARY}
        found.append(Checkpoint(digests[2], 3, 0, (), summary, f"c{i}", "llm"))
    return found


async def longest_stall(work: Awaitable[None]) -> float:
    """The longest a 1 ms ticker was late while `work` ran (ms)."""
    worst = 0.0
    done = False

    async def tick() -> None:
        nonlocal worst
        while not done:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - started - 0.001)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.005)  # the ticker runs before the work starts
    await work
    done = True
    await ticker
    return worst * 1000


async def on_the_loop(path: Path, rows: list[Checkpoint], together: bool) -> None:
    """The rows written on the event loop: one transaction each, or one for all."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.execute(
        "CREATE TABLE IF NOT EXISTS checkpoints (key BLOB PRIMARY KEY, cut INTEGER, body BLOB)"
    )
    statement = "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?)"
    values = [(c.key, c.cut, orjson.dumps(c.to_json())) for c in rows]
    if together:
        with connection:
            connection.execute("BEGIN")
            connection.executemany(statement, values)
    else:
        for value in values:
            with connection:
                connection.execute("BEGIN")
                connection.execute(statement, value)
            await asyncio.sleep(0)
    connection.close()


async def in_the_store(path: Path, rows: list[Checkpoint], together: bool) -> None:
    store = SqliteStore(
        StateFile(path, metrics=StateMetrics(CollectorRegistry())),
        max_entries=100_000,
        ttl_s=3600,
        failure_threshold=3,
        failure_cooldown_s=60,
    )
    await store.open()
    if together:
        await asyncio.gather(*(store.put(row) for row in rows))
    else:
        for row in rows:
            await store.put(row)
    await store.close()


async def main_async(count: int) -> None:
    rows = checkpoints(count)
    ways: dict[str, Callable[[Path, list[Checkpoint], bool], Awaitable[None]]] = {
        "on the loop": on_the_loop,
        "store (thread)": in_the_store,
    }
    print(f"{count} checkpoints of {len(SUMMARY)} characters each:")
    print(
        f"{'writer':>15} {'mode':>14} {'total ms':>9} {'per put ms':>11} {'longest stall ms':>17}"
    )
    with tempfile.TemporaryDirectory() as directory:
        for name, write in ways.items():
            for together in (False, True):
                path = Path(directory) / f"{name}-{together}.sqlite3"
                started = time.perf_counter()
                stall = await longest_stall(write(path, rows, together))
                total = (time.perf_counter() - started) * 1000
                mode = "all at once" if together else "one by one"
                print(f"{name:>15} {mode:>14} {total:9.1f} {total / count:11.3f} {stall:17.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500)
    asyncio.run(main_async(parser.parse_args().count))


if __name__ == "__main__":
    main()
