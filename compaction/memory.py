"""The memory file: items worth keeping, appended to a per-session file, each once.

`{root}/{session_id}/compaction_flush.jsonl` holds one JSON object per line. A flush writes the
file's lines plus its new ones to a temporary file in the session folder and renames it over the
file, under an exclusive `flock` on the folder: concurrent writers (tasks or processes) take turns,
and a writer killed mid-flush or stopped by a full disk leaves the file as it was, so every line
always parses. (An O_APPEND write is not enough: a SIGKILL can cut a large write short.) Files are
created 0600 in directories created 0700; links are never followed (a symlinked folder, a
symlinked file or one with a second hard link is refused), so nothing is read or written outside
the root. The only file I/O in the library lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import orjson
from cachetools import LRUCache

from compaction.types import MemoryItem, as_memory_type

FILE_NAME = "compaction_flush.jsonl"
logger = logging.getLogger(__name__)
_TEMPORARY = ".tmp"  # suffix of the file a flush writes before renaming it over FILE_NAME
_NO_LINKS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO cannot hang us
_WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_LINKS
SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


class InvalidSessionId(ValueError):
    """A session id that could name a path outside the memory directory."""


def is_valid_session_id(value: str) -> bool:
    """The one rule for session ids (README "Sessions"): 1-128 of [A-Za-z0-9._-], no leading dot."""
    return len(value) <= 128 and _is_valid_short_id(value)


@functools.lru_cache(maxsize=4096)  # asked for every request; a session's id comes again and again
def _is_valid_short_id(value: str) -> bool:
    return SESSION_ID.fullmatch(value) is not None and not value.startswith(".")


# ---------------------------------------------------------------- the file


def item_identity(content: str) -> str:
    """What two items must share to count as the same: case, spacing and end punctuation aside
    (MemoryItem.identity, for a text read back from the file)."""
    return MemoryItem(type="fact", content=content).identity


class ItemClaims(Protocol):
    """De-duplication shared by writers that do not see each other's cache (replicas writing to
    one memory directory): `claim` returns the keys of `keys` never claimed before for the session
    (claiming them), `release` gives back keys whose lines could not be written."""

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]: ...

    async def release(self, session_id: str, keys: Sequence[str]) -> None: ...


def _utc_now() -> datetime:
    return datetime.now(UTC)


class MemoryWriter:
    """Appends memory items to `{root_dir}/{session_id}/compaction_flush.jsonl`, each once."""

    def __init__(
        self,
        root_dir: str | os.PathLike[str],
        *,
        now: Callable[[], datetime] = _utc_now,
        max_sessions: int = 512,
        max_items: int = 10000,
        write: Callable[[int, bytes], int] = os.write,
        claims: ItemClaims | None = None,
    ) -> None:
        """`write` is `os.write` (tests pass one that fills the disk)."""
        self.root = Path(root_dir)
        self._now = now
        self._write = write
        self._claims = claims
        # Bounded: every fingerprinted conversation is a session, and a long one writes items for
        # as long as it lives: at most `max_sessions` sessions and `max_items` keys of items
        # written in all. A session whose entries were evicted reloads what it has written from
        # its file; a lock evicted while held can let two flushes run at once, which costs at
        # most a duplicate line, never a torn one.
        self._locks: LRUCache[str, asyncio.Lock] = LRUCache(max_sessions)
        self._seen: LRUCache[str, set[tuple[str, str]]] = LRUCache(
            max_items, getsizeof=lambda seen: len(seen) + 1
        )
        self._max_sessions = max_sessions

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
            stamp = {
                "session_id": session_id,
                "compaction_id": compaction_id,
                "timestamp": self._now().astimezone(UTC).isoformat(),
            }
            # In a thread: a long fold's overflow is tens of thousands of items, a Python step
            # and a normalization (the item's identity) each (a quarter of a second and more at
            # 50 MiB of history), which the event loop would wait out whole; a thread gives the
            # GIL back every few milliseconds. It only reads `seen` (the session's lock keeps
            # other writers out); the keys join `seen` once written, so a flush cancelled or
            # failed on the way leaves nothing marked.
            records, keys, claims = await asyncio.to_thread(_unseen, items, seen, stamp)
            if records and self._claims is not None:
                records = await self._claimed(session_id, records, claims)
            if records:
                try:
                    await asyncio.to_thread(_append_lines, path, records, self._write)
                except BaseException:
                    # Not written (a flush is all or nothing): a later flush may try them again.
                    if self._claims is not None:
                        await self._claims.release(session_id, [_claim_key(r) for r in records])
                    raise
            seen.update(keys)  # those another writer claimed too: it writes them
            self._keep(session_id, seen)
            return records

    def _keep(self, session_id: str, seen: set[tuple[str, str]]) -> None:
        """`seen` as the session's, sized again (it grew); a session with more keys than the
        whole bound is read back from its file on each write instead."""
        if len(seen) + 1 > self._seen.maxsize:
            self._seen.pop(session_id, None)
            return
        self._seen[session_id] = seen
        while len(self._seen) > self._max_sessions:
            self._seen.popitem()

    async def _claimed(
        self, session_id: str, records: list[dict[str, str]], keys: list[str]
    ) -> list[dict[str, str]]:
        """The records no other writer has claimed (`keys`: their claim keys); all of them when
        the claims cannot be asked (this writer's own de-duplication still holds)."""
        assert self._claims is not None
        try:
            fresh = await self._claims.claim(session_id, keys)
        except Exception:
            return records
        return [record for record, key in zip(records, keys, strict=True) if key in fresh]


def _unseen(
    items: Sequence[MemoryItem], seen: set[tuple[str, str]], stamp: dict[str, str]
) -> tuple[list[dict[str, str]], list[tuple[str, str]], list[str]]:
    """The records of the items whose key is neither in `seen` nor earlier among them (each with
    `stamp`'s fields), their keys and their claim keys."""
    records: list[dict[str, str]] = []
    keys: list[tuple[str, str]] = []
    claims: list[str] = []
    new: set[tuple[str, str]] = set()
    for item in items:
        key = (item.type, item.identity)
        if key in seen or key in new:
            continue
        new.add(key)
        keys.append(key)
        claims.append(f"{item.type}\x00{item.identity}")
        records.append({"type": item.type, "content": item.content, **stamp})
    return records, keys, claims


def _claim_key(record: dict[str, str]) -> str:
    return f"{record['type']}\x00{item_identity(record['content'])}"


async def write_items(
    memory: MemoryWriter | None,
    session_id: str | None,
    compaction_id: str,
    items: Sequence[MemoryItem],
) -> str | None:
    """Append `items` with `memory` (if any); the error as text when writing failed, which must
    never cost the compaction that produced them."""
    if memory is None or session_id is None or not items:
        return None
    try:
        # write, not append: nothing here reads the items back (append builds one per record)
        await memory.write(session_id, compaction_id, items)
    except Exception as exc:  # a memory file problem is reported, not raised
        logger.warning("memory flush failed for session %r: %r", session_id, exc)
        return f"memory flush failed: {type(exc).__name__}: {exc}"
    return None


def _load_keys(path: Path) -> set[tuple[str, str]]:
    """(type, normalized content) of every line already in the file."""
    keys: set[tuple[str, str]] = set()
    try:
        with _session_folder(path, create=False) as folder:
            data = _read_lines(folder, path.name)
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


def _append_lines(
    path: Path, records: Sequence[dict[str, str]], write: Callable[[int, bytes], int]
) -> None:
    """The file's lines and one line per record, written to a temporary file renamed over it."""
    new = b"".join(orjson.dumps(record) + b"\n" for record in records)
    with _session_folder(path, create=True) as folder:
        # Every writer, in any process, holds this while it writes; released on close or crash.
        fcntl.flock(folder, fcntl.LOCK_EX)
        if os.fstat(folder).st_nlink == 0:  # pruned while this writer waited: a new folder
            return _append_lines(path, records, write)
        _remove_leftovers(folder, path.name)
        try:
            old = _read_lines(folder, path.name)
        except FileNotFoundError:
            old = b""
        temporary = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{_TEMPORARY}"
        fd = os.open(temporary, _WRITE_NEW, 0o600, dir_fd=folder)
        try:
            try:
                _write_all(fd, old + new, write)
            finally:
                os.close(fd)
            os.rename(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise


def prune_memory(root_dir: str | os.PathLike[str], max_age_s: float, *, now: float) -> list[str]:
    """Remove the session folders under `root_dir` not written for `max_age_s` seconds before
    `now` (time.time()): the sessions removed. Each folder is taken under the writers' `flock`;
    a writer that waited on it finds the folder gone and makes a new one. A folder holding
    anything but what the writer leaves is kept. Reads and removes files: call it off the
    event loop."""
    root = Path(root_dir)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    removed: list[str] = []
    for name in names:
        if not is_valid_session_id(name):
            continue
        with contextlib.suppress(OSError):  # a link, a file, a folder of other things: kept
            if _prune_folder(root, name, now - max_age_s):
                removed.append(name)
    return removed


def _prune_folder(root: Path, name: str, cutoff: float) -> bool:
    with _session_folder(root / name / FILE_NAME, create=False) as folder:
        fcntl.flock(folder, fcntl.LOCK_EX)
        newest = os.fstat(folder).st_mtime  # a rename over the file (each flush) touches it
        with contextlib.suppress(FileNotFoundError):
            written = os.stat(FILE_NAME, dir_fd=folder, follow_symlinks=False).st_mtime
            newest = max(newest, written)
        entries = os.listdir(folder)
        ours = [e for e in entries if e == FILE_NAME or e.startswith(f".{FILE_NAME}.")]
        if newest > cutoff or len(ours) < len(entries):
            return False
        for entry in ours:
            os.unlink(entry, dir_fd=folder)
        os.rmdir(root / name)
        return True


def _write_all(fd: int, data: bytes, write: Callable[[int, bytes], int]) -> None:
    while data:
        written = write(fd, data)
        if written <= 0:
            raise OSError(errno.ENOSPC, "no space left: nothing written")
        data = data[written:]  # a short write (a filling disk): go on until it fails outright


def _read_lines(folder: int, name: str) -> bytes:
    """The file's whole lines; a torn tail (from a writer of another kind) is left out."""
    fd = os.open(name, os.O_RDONLY | _NO_LINKS, dir_fd=folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise OSError(errno.EPERM, f"{name} is not a plain file of its own; not used")
        data = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    return data if data.endswith(b"\n") or not data else data[: data.rfind(b"\n") + 1]


def _remove_leftovers(folder: int, name: str) -> None:
    """Temporary files of writers killed before their rename (none is writing: we hold the lock)."""
    prefix = f".{name}."
    for entry in os.listdir(folder):
        if entry.startswith(prefix) and entry.endswith(_TEMPORARY):
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=folder)


@contextlib.contextmanager
def _session_folder(path: Path, *, create: bool) -> Iterator[int]:
    """The session folder of `path`, opened without following a link."""
    if create:
        # The root too: a listable root lists every session id (mkdir's `parents` would make
        # it with the default mode).
        path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | _NO_LINKS)
    try:
        yield folder
    finally:
        os.close(folder)
