"""The memory file under attack: links planted in the memory folder, a disk that fills mid-line.
Nothing is written outside `memory.dir`, and every line of the file always parses."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from compaction import MemoryItem, MemoryWriter


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


async def test_a_torn_tail_left_by_another_writer_is_never_glued_to_the_next_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s" / "compaction_flush.jsonl"
    path.parent.mkdir(parents=True)
    whole = json.dumps({"type": "fact", "content": "whole"}).encode()
    path.write_bytes(whole + b"\n" + b'{"type": "fact", "con')  # a writer died mid-line
    await MemoryWriter(tmp_path).append("s", "c2", [MemoryItem("todo", "next")])
    lines = path.read_bytes().splitlines()
    assert json.loads(lines[0])["content"] == "whole"
    assert lines[1] == b'{"type": "fact", "con'
    assert json.loads(lines[2])["content"] == "next"


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


async def test_items_not_written_for_lack_of_space_are_written_by_a_later_flush_once(
    tmp_path: Path,
) -> None:
    disk = FailingAfter(1)
    writer = MemoryWriter(tmp_path, write=disk)
    items = [MemoryItem("fact", "a"), MemoryItem("fact", "b")]
    with pytest.raises(OSError):
        await writer.append("s", "c1", items)
    path = tmp_path / "s" / "compaction_flush.jsonl"
    assert [r["content"] for r in _records(path)] == ["a"]
    disk.calls = None
    assert await writer.append("s", "c2", items) == [MemoryItem("fact", "b")]
    assert [r["content"] for r in _records(path)] == ["a", "b"]
