"""The memory file: items worth keeping, appended to a per-session file, each once.

`{root}/{session_id}/compaction_flush.jsonl` holds one JSON object per line. Each line goes out
in a single `os.write` on a descriptor opened with O_APPEND, so concurrent writers (tasks or
processes) and a writer killed mid-flush leave only whole lines. Files are created 0600 in
directories created 0700. The only file I/O in the library lives here.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

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
        max_sessions: int = 4096,
        claims: ItemClaims | None = None,
    ) -> None:
        self.root = Path(root_dir)
        self._now = now
        self._claims = claims
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
            if records and self._claims is not None:
                records = await self._claimed(session_id, records)
            if records:
                try:
                    await asyncio.to_thread(_append_lines, path, records)
                except BaseException:
                    # Not written: a later flush may try these again.
                    for record in records:
                        seen.discard((record["type"], item_identity(record["content"])))
                    if self._claims is not None:
                        await self._claims.release(session_id, [_claim_key(r) for r in records])
                    raise
            return records

    async def _claimed(
        self, session_id: str, records: list[dict[str, str]]
    ) -> list[dict[str, str]]:
        """The records no other writer has claimed; all of them when the claims cannot be asked
        (this writer's own de-duplication still holds)."""
        assert self._claims is not None
        keys = [_claim_key(record) for record in records]
        try:
            fresh = await self._claims.claim(session_id, keys)
        except Exception:
            return records
        return [record for record, key in zip(records, keys, strict=True) if key in fresh]


def _claim_key(record: dict[str, str]) -> str:
    return f"{record['type']}\x00{item_identity(record['content'])}"


def _load_keys(path: Path) -> set[tuple[str, str]]:
    """(type, normalized content) of every whole line already in the file."""
    keys: set[tuple[str, str]] = set()
    try:
        data = path.read_bytes()
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


def _append_lines(path: Path, records: Sequence[dict[str, str]]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        for record in records:
            line = orjson.dumps(record) + b"\n"
            # One write per line: with O_APPEND the kernel places it whole at the end.
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
    finally:
        os.close(fd)
