"""`archive.max_total_mb` holds for the state file: sessions past the bound drop the least
recently archived ones whole, their index rows and freed pages with them, and the file levels off
under the bound; the newest sessions are still found."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from proxy.state.archive import Entry, Scope
from proxy.state.archive.sqlite import SqliteArchive
from proxy.state.sqlite_file import StateFile

MIB = 1 << 20


def conversation(
    number: int, *, compactions: int = 4, turns: int = 20, at: float = 1e6
) -> list[list[Entry]]:
    """A session's folded turns, one list per compaction: prose of a common vocabulary with
    identifiers of its own (paths, hashes), and now and then a long tool output."""
    rng = random.Random(number)
    vocabulary = [f"word{i}" for i in range(3000)]
    batches = []
    for compaction in range(compactions):
        batch = []
        for turn in range(turns):
            index = compaction * turns + turn
            words = rng.choices(vocabulary, k=rng.randrange(20, 200))
            words += [f"{rng.getrandbits(48):012x}" for _ in range(rng.randrange(0, 20))]
            if rng.random() < 0.1:  # a tool's output: long, and repetitive
                words += [
                    f"line {n}: ok src/module{n % 40}.py" for n in range(rng.randrange(100, 400))
                ]
            text = f"session{number} turn{index} " + " ".join(words)
            body = '{"role":"user","content":' + repr(text).replace("'", '"') + "}"
            batch.append(
                Entry.of(index, "chat", "message", f"c{number}-{compaction}", at, body, text)
            )
        batches.append(batch)
    return batches


async def test_the_state_file_levels_off_under_the_total_bound(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    bound = 1 * MIB
    archive = SqliteArchive(
        StateFile(path, clock=lambda: 1e6), max_bytes=64 * MIB, max_age_s=1e9,
        max_total_bytes=bound, clock=lambda: 1e6,
    )  # fmt: skip
    await archive.open()
    sizes = []
    dropped = 0
    for number in range(120):
        for batch in conversation(number):
            dropped += (await archive.add(Scope(f"agent-{number}", "aa" * 16), batch))["total"]
        sizes.append(path.stat().st_size)
    # What the file holds besides the archive: its schema and the store's empty tables.
    assert max(sizes[40:]) <= bound + 128 * 1024, [round(size / MIB, 2) for size in sizes[::10]]
    assert dropped > 0
    newest = await archive.search("agent-119", "session119 turn79", tenant=None, limit=1)
    assert [found.index for found in newest] == [79]
    assert await archive.search("agent-0", "session0", tenant=None, limit=1) == []
    await archive.close()
    with sqlite3.connect(path) as connection:
        (scopes,) = connection.execute("SELECT count(*) FROM archive_sizes").fetchone()
        (owned,) = connection.execute("SELECT count(*) FROM archive_owners").fetchone()
        (turns,) = connection.execute("SELECT count(*) FROM archive").fetchone()
        (listed,) = connection.execute(
            "SELECT count(DISTINCT session) FROM archive_compactions"
        ).fetchone()
    assert owned == turns and listed == scopes < 120
