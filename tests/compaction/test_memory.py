"""The memory file: whole lines only, private, each item once."""

from __future__ import annotations

import asyncio
import json
import stat
from datetime import datetime
from pathlib import Path

import pytest

from compaction import InvalidSessionId, MemoryItem, MemoryWriter


def _lines(path: Path) -> list[dict[str, str]]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "last line is torn"
    return [json.loads(line) for line in raw.splitlines()]


# ---------------------------------------------------------------- the file


async def test_append_writes_whole_records_with_every_field(
    writer: MemoryWriter, memory_dir: Path
) -> None:
    written = await writer.append("s1", "c1", [MemoryItem("fact", "Port is 8080")])
    assert written == [MemoryItem("fact", "Port is 8080")]
    path = memory_dir / "s1" / "compaction_flush.jsonl"
    (record,) = _lines(path)
    assert set(record) == {"type", "content", "session_id", "compaction_id", "timestamp"}
    assert record["session_id"] == "s1" and record["compaction_id"] == "c1"
    assert datetime.fromisoformat(record["timestamp"]).utcoffset().total_seconds() == 0


async def test_file_is_private(writer: MemoryWriter, memory_dir: Path) -> None:
    await writer.append("s1", "c1", [MemoryItem("fact", "secret")])
    assert stat.S_IMODE((memory_dir / "s1" / "compaction_flush.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((memory_dir / "s1").stat().st_mode) == 0o700


async def test_duplicates_are_not_written_again_even_by_a_new_writer(memory_dir: Path) -> None:
    first = MemoryWriter(memory_dir)
    await first.append("s", "c1", [MemoryItem("decision", "Use React")])
    again = await first.append(
        "s", "c2", [MemoryItem("decision", "use  react."), MemoryItem("todo", "Ship")]
    )
    assert again == [MemoryItem("todo", "Ship")]
    fresh = MemoryWriter(memory_dir)
    assert (
        await fresh.append(
            "s", "c3", [MemoryItem("decision", "Use React"), MemoryItem("todo", "Ship")]
        )
        == []
    )
    assert len(_lines(memory_dir / "s" / "compaction_flush.jsonl")) == 2


async def test_fifty_concurrent_appends_leave_only_whole_lines(memory_dir: Path) -> None:
    writers = [MemoryWriter(memory_dir) for _ in range(5)]  # separate dedup sets share one file
    big = "x" * 20_000

    async def flush(n: int) -> None:
        items = [MemoryItem("fact", f"item {n}-{k} {big}") for k in range(4)]
        await writers[n % 5].append("shared", f"c{n}", items)

    await asyncio.gather(*(flush(n) for n in range(50)))
    records = _lines(memory_dir / "shared" / "compaction_flush.jsonl")
    assert len(records) == 200
    assert {r["content"].split()[1] for r in records} == {
        f"{n}-{k}" for n in range(50) for k in range(4)
    }


@pytest.mark.parametrize(
    "session_id", ["..", ".hidden", "a/b", "../etc", "", "a" * 129, "x\x00y", "sp ace"]
)
async def test_session_ids_that_could_escape_are_refused(
    writer: MemoryWriter, memory_dir: Path, session_id: str
) -> None:
    with pytest.raises(InvalidSessionId):
        await writer.append(session_id, "c", [MemoryItem("fact", "x")])
    assert not memory_dir.exists() or not any(memory_dir.rglob("*.jsonl"))


async def test_evicted_sessions_reload_what_they_wrote_and_never_write_it_twice(
    tmp_path: Path,
) -> None:
    writer = MemoryWriter(tmp_path, max_sessions=2)
    item = MemoryItem("fact", "The build uses Python 3.11.")
    assert len(await writer.append("first", "c1", [item])) == 1
    for other in ("second", "third"):  # push "first" out of the caches
        await writer.append(other, "c2", [MemoryItem("todo", "something")])
    assert await writer.append("first", "c3", [item]) == []
    assert len((tmp_path / "first" / "compaction_flush.jsonl").read_text().splitlines()) == 1


async def test_the_items_kept_in_memory_are_bounded_over_all_sessions(tmp_path: Path) -> None:
    # A few sessions, but one writes many items: the keys of the least recently writing
    # session go once all of them pass `max_items`; it is read back from its file. Seen through
    # the file: emptied behind the writer's back, an item is written again only if read back.
    writer = MemoryWriter(tmp_path, max_sessions=100, max_items=10)
    item = MemoryItem("fact", "The build uses Python 3.11.")
    await writer.append("quiet", "c1", [item])
    (tmp_path / "quiet" / "compaction_flush.jsonl").write_text("")
    assert await writer.append("quiet", "c2", [item]) == []  # still kept: not read back
    busy = [MemoryItem("fact", f"Fact number {n}.") for n in range(9)]
    assert len(await writer.append("busy", "c3", busy)) == 9
    assert await writer.append("quiet", "c4", [item]) == [item]  # forgotten, read back: empty
    # A session with more than the whole bound is read back from its file each time.
    many = [MemoryItem("fact", f"Fact number {n}.") for n in range(20)]
    assert len(await writer.append("big", "c5", many)) == 20
    assert await writer.append("big", "c6", many) == []
    assert len((tmp_path / "big" / "compaction_flush.jsonl").read_text().splitlines()) == 20
