"""The memory file: items worth keeping, appended to a per-session file, each once.

`{root}/{session_id}/compaction_flush.jsonl` holds one JSON object per line. Each line goes out
in a single `os.write` on a descriptor opened with O_APPEND under an exclusive `flock`, so
concurrent writers (tasks or processes) and a writer killed mid-flush leave only whole lines. A short write (a full disk) is
cut back off, and a line always starts on a fresh line, so every line parses. Files are created
0600 in directories created 0700; links are never followed (a symlinked folder or file, or a file
with a second hard link, is refused), so nothing is written outside the root. The only file I/O in
the library lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import orjson
from cachetools import LRUCache

from compaction.text import normalize
from compaction.types import MemoryItem, as_memory_type

FILE_NAME = "compaction_flush.jsonl"
SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


class InvalidSessionId(ValueError):
    """A session id that could name a path outside the memory directory."""


def is_valid_session_id(value: str) -> bool:
    """The one rule for session ids (DESIGN §5): 1-128 of [A-Za-z0-9._-], no leading dot."""
    return SESSION_ID.fullmatch(value) is not None and not value.startswith(".")


# ---------------------------------------------------------------- the file


def item_identity(content: str) -> str:
    """What two items must share to count as the same: case, spacing and end punctuation aside."""
    return normalize(content).rstrip(".。!！")


def _utc_now() -> datetime:
    return datetime.now(UTC)


class MemoryWriter:
    """Appends memory items to `{root_dir}/{session_id}/compaction_flush.jsonl`, each once."""

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        *,
        now: Callable[[], datetime] = _utc_now,
        max_sessions: int = 4096,
        write: Callable[[int, bytes], int] = os.write,
    ) -> None:
        """`write` is `os.write` (tests pass one that fills the disk)."""
        self.root = Path(root_dir)
        self._now = now
        self._write = write
        # Bounded: every fingerprinted conversation is a session. A session whose entries were
        # evicted reloads what it has written from its file; a lock evicted while held can let two
        # flushes run at once, which costs at most a duplicate line, never a torn one.
        self._locks: LRUCache[str, asyncio.Lock] = LRUCache(max_sessions)
        self._seen: LRUCache[str, set[tuple[str, str]]] = LRUCache(max_sessions)

    def path_for(self, session_id: str) -> Path:
        """The session's memory file; raises InvalidSessionId for anything that could escape."""
        if not is_valid_session_id(session_id):
            raise InvalidSessionId(f"invalid session id {session_id!r}")
        root = self.root.resolve()
        folder = (root / session_id).resolve()
        if folder.parent != root:
            raise InvalidSessionId(f"session id {session_id!r} escapes the memory directory")
        return folder / FILE_NAME

    async def append(
        self, session_id: str, compaction_id: str, items: Sequence[MemoryItem]
    ) -> list[MemoryItem]:
        """Write the items not already in the session's file; return those written."""
        records = await self.write(session_id, compaction_id, items)
        return [MemoryItem(as_memory_type(r["type"]), r["content"]) for r in records]

    async def write(
        self, session_id: str, compaction_id: str, items: Sequence[MemoryItem]
    ) -> list[dict[str, str]]:
        """Like append, returning the records exactly as written to the file."""
        path = self.path_for(session_id)
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        async with lock:
            seen = self._seen.get(session_id)
            if seen is None:
                seen = await asyncio.to_thread(_load_keys, path)
                self._seen[session_id] = seen
            timestamp = self._now().astimezone(UTC).isoformat()
            records: list[dict[str, str]] = []
            for item in items:
                key = (item.type, item_identity(item.content))
                if key in seen:
                    continue
                seen.add(key)
                records.append(
                    {
                        "type": item.type,
                        "content": item.content,
                        "session_id": session_id,
                        "compaction_id": compaction_id,
                        "timestamp": timestamp,
                    }
                )
            if records:
                try:
                    await asyncio.to_thread(_append_lines, path, records, self._write)
                except _PartlyWritten as partly:
                    _forget(seen, records[partly.done :])
                    raise partly.error from None
                except BaseException:
                    _forget(seen, records)
                    raise
            return records


def _load_keys(path: Path) -> set[tuple[str, str]]:
    """(type, normalized content) of every whole line already in the file."""
    keys: set[tuple[str, str]] = set()
    try:
        with _open_in_folder(path, os.O_RDONLY) as fd:
            data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    except FileNotFoundError:
        return keys
    for line in data.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("content"), str):
            keys.add((str(record.get("type")), item_identity(record["content"])))
    return keys


def _forget(seen: set[tuple[str, str]], records: Sequence[dict[str, str]]) -> None:
    """Not written after all: a later flush may try these again."""
    for record in records:
        seen.discard((record["type"], item_identity(record["content"])))


class _PartlyWritten(Exception):
    """The OSError that stopped an append, and how many records it had written whole."""

    def __init__(self, error: OSError, done: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.done = done


def _append_lines(
    path: Path, records: Sequence[dict[str, str]], write: Callable[[int, bytes], int]
) -> None:
    """Append one line per record, or raise _PartlyWritten; a line cut short is taken back."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
    with _open_in_folder(path, flags) as fd:
        # Writers of other processes wait here, so the tail checked below is the real tail and a
        # failed line can be taken back. Released when the descriptor closes, also on a crash.
        fcntl.flock(fd, fcntl.LOCK_EX)
        done = 0
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # Another writer was cut short (say by a full disk) and could not clean up:
                # start on a fresh line rather than glue this record to the torn one.
                size += _write_whole(fd, b"\n", write, size)
            for record in records:
                line = orjson.dumps(record) + b"\n"
                # One write per line: with O_APPEND the kernel places it whole at the end.
                size += _write_whole(fd, line, write, size)
                done += 1
        except OSError as exc:
            raise _PartlyWritten(exc, done) from exc


def _write_whole(fd: int, data: bytes, write: Callable[[int, bytes], int], size: int) -> int:
    """Write `data` at the end in one call, or take back what a short write left and raise."""
    written = 0
    try:
        written = write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes")
    except OSError:
        # Only when the file is exactly as this write left it (a writer that takes no lock
        # may have appended since, and its line must not be cut).
        with contextlib.suppress(OSError):
            if written > 0 and os.fstat(fd).st_size == size + written:
                os.ftruncate(fd, size)
        raise
    return written


@contextlib.contextmanager
def _open_in_folder(path: Path, flags: int) -> Iterator[int]:
    """`path` opened without following a link, in its session folder also opened without
    following one; a file with another hard link (which could be anywhere) is refused too."""
    # O_NONBLOCK: a FIFO planted in the folder must not hang the reader (then refused below).
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    try:
        fd = os.open(path.name, flags | nofollow, 0o600, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EPERM, f"{path} is not a plain file of its own; not written")
        yield fd
    finally:
        os.close(fd)
