"""The memory file under attack: links planted in the memory folder, a disk that fills mid-line.
Nothing is written outside `memory.dir`, and every line of the file always parses."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compaction import MemoryItem, MemoryWriter

REPO = Path(__file__).resolve().parents[2]


def _records(path: Path) -> list[dict[str, str]]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), "last line is torn"
    return [json.loads(line) for line in raw.splitlines()]  # every line parses


def _plant(kind: str, target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True)
    if kind == "symlink":
        link.symlink_to(target)
    else:
        os.link(target, link)


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
async def test_a_memory_file_linked_to_a_file_outside_is_never_written_through(
    tmp_path: Path, kind: str
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious\n")
    memory_dir = tmp_path / "memory"
    _plant(kind, outside, memory_dir / "victim" / "compaction_flush.jsonl")
    writer = MemoryWriter(memory_dir)
    with pytest.raises(OSError):
        await writer.append("victim", "c1", [MemoryItem("fact", "x")])
    assert outside.read_bytes() == b"precious\n"


class FillingDisk:
    """`os.write` on a disk with `room` bytes left: a short write, then ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, fd: int, data: bytes) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = os.write(fd, data[: self.room])
        self.room -= written
        return written


async def test_a_short_write_on_a_full_disk_leaves_no_torn_line(tmp_path: Path) -> None:
    disk = FillingDisk(room=10**6)
    writer = MemoryWriter(tmp_path, write=disk)
    await writer.append("s", "c1", [MemoryItem("fact", "first, written whole")])
    disk.room = 40  # the next line (~150 bytes) only partly fits
    with pytest.raises(OSError):
        await writer.append("s", "c2", [MemoryItem("decision", "second " + "y" * 100)])
    path = tmp_path / "s" / "compaction_flush.jsonl"
    assert [r["content"] for r in _records(path)] == ["first, written whole"]
    disk.room = 10**6  # space freed: the lost item is written on the next flush, on its own line
    await writer.append("s", "c3", [MemoryItem("decision", "second " + "y" * 100)])
    assert [r["compaction_id"] for r in _records(path)] == ["c1", "c3"]


async def test_a_torn_tail_left_by_another_writer_is_dropped_never_glued_to_the_next_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s" / "compaction_flush.jsonl"
    path.parent.mkdir(parents=True)
    whole = json.dumps({"type": "fact", "content": "whole"}).encode()
    path.write_bytes(whole + b"\n" + b'{"type": "fact", "con')  # an O_APPEND writer died mid-line
    await MemoryWriter(tmp_path).append("s", "c2", [MemoryItem("todo", "next")])
    assert [r["content"] for r in _records(path)] == ["whole", "next"]


class FailingAfter:
    """`os.write` that fails with ENOSPC after `calls` successful calls (None: never)."""

    def __init__(self, calls: int | None) -> None:
        self.calls = calls

    def __call__(self, fd: int, data: bytes) -> int:
        if self.calls is not None:
            if self.calls <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.calls -= 1
        return os.write(fd, data)


async def test_a_flush_the_disk_refuses_writes_none_of_its_items_and_they_come_again_once(
    tmp_path: Path,
) -> None:
    disk = FailingAfter(None)
    writer = MemoryWriter(tmp_path, write=disk)
    await writer.append("s", "c1", [MemoryItem("fact", "a")])
    disk.calls = 0
    items = [MemoryItem("fact", "a"), MemoryItem("fact", "b"), MemoryItem("fact", "c")]
    with pytest.raises(OSError):
        await writer.append("s", "c2", items)
    path = tmp_path / "s" / "compaction_flush.jsonl"
    assert [r["content"] for r in _records(path)] == ["a"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    disk.calls = None
    assert await writer.append("s", "c3", items) == items[1:]
    assert [r["content"] for r in _records(path)] == ["a", "b", "c"]


def test_a_writer_killed_mid_flush_leaves_the_file_whole_every_time(tmp_path: Path) -> None:
    # Large lines and many kills: an O_APPEND write of 200 KB is cut short by SIGKILL now and
    # then; a flush renamed into place never is.
    for attempt in range(8):
        memory_dir = tmp_path / str(attempt)
        process = subprocess.Popen(
            [sys.executable, "-c", _KILLED_WRITER, str(memory_dir)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert process.stdout is not None and process.stdout.readline() == b"ready\n"
            time.sleep(0.05 * (attempt % 4))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
        assert len(_records(memory_dir / "victim" / "compaction_flush.jsonl")) >= 2


_KILLED_WRITER = """
import asyncio, sys
from compaction import MemoryItem, MemoryWriter

async def main():
    writer = MemoryWriter(sys.argv[1])
    n = 0
    while True:
        await writer.append("victim", f"c{n}", [MemoryItem("fact", f"{n} " + "z" * 200_000)])
        n += 1
        if n == 2:
            print("ready", flush=True)

asyncio.run(main())
"""
