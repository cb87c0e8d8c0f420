"""The memory flush: items worth keeping, parsed or guessed, appended to a per-session file.

`{root}/{session_id}/compaction_flush.jsonl` holds one JSON object per line. Each line goes out
in a single `os.write` on a descriptor opened with O_APPEND, so concurrent writers (tasks or
processes) and a writer killed mid-flush leave only whole lines. Files are created 0600 in
directories created 0700. The only file I/O in the library lives here.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from cachetools import LRUCache

from compaction.summarize import is_user_request, message_text
from compaction.types import MemoryItem, MemoryType, is_message

FILE_NAME = "compaction_flush.jsonl"
MEMORY_TYPES: frozenset[str] = frozenset({"decision", "fact", "preference", "todo"})
MAX_CONTENT_CHARS = 1000
SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

_FENCE_LINE = re.compile(r"^\s*```[\w-]*\s*$", re.MULTILINE)
_WHITESPACE = re.compile(r"\s+")


class InvalidSessionId(ValueError):
    """A session id that could name a path outside the memory directory."""


def is_valid_session_id(value: str) -> bool:
    """The one rule for session ids (DESIGN §5): 1-128 of [A-Za-z0-9._-], no leading dot."""
    return SESSION_ID.fullmatch(value) is not None and not value.startswith(".")


# ---------------------------------------------------------------- parsing the LLM's answer


def parse_memory_reply(text: str) -> list[MemoryItem] | None:
    """The items of the first JSON array in `text`; None when there is no array at all.

    Code fences and prose around the array are ignored; items that are not objects with a known
    `type` and a non-empty string `content` are dropped.
    """
    found = _first_json_array(_FENCE_LINE.sub("", text))
    if found is None:
        return None
    items: list[MemoryItem] = []
    for entry in found:
        item = _memory_item(entry)
        if item is not None and item not in items:
            items.append(item)
    return items


def parse_memory_items(text: str) -> list[MemoryItem]:
    """Like parse_memory_reply, with [] when the text holds no array."""
    return parse_memory_reply(text) or []


def _first_json_array(text: str) -> list[Any] | None:
    """The first JSON array holding an object (prose like "see [1]" is skipped), else the first
    array of any kind, else None."""
    decoder = json.JSONDecoder()
    first: list[Any] | None = None
    start = text.find("[")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list):
            if any(isinstance(entry, dict) for entry in value):
                return value
            first = value if first is None else first
        start = text.find("[", start + 1)
    return first


def _memory_item(entry: Any) -> MemoryItem | None:
    if not isinstance(entry, dict):
        return None
    kind = entry.get("type")
    content = entry.get("content")
    if not isinstance(kind, str) or not isinstance(content, str):
        return None
    kind = kind.strip().lower()
    content = _WHITESPACE.sub(" ", content).strip()[:MAX_CONTENT_CHARS]
    if kind not in MEMORY_TYPES or not content:
        return None
    return MemoryItem(_as_type(kind), content)


def _as_type(kind: str) -> MemoryType:
    if kind == "decision":
        return "decision"
    if kind == "preference":
        return "preference"
    if kind == "todo":
        return "todo"
    return "fact"


# ---------------------------------------------------------------- extraction without an LLM

_PREFERENCE = re.compile(
    r"\b(?:i prefer|prefer|always|never|don't|do not|avoid|please use)\b|偏好|喜欢|总是|不要|别用|请用",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:decided|we decide|let's use|let's go with|we will|we'll use|going with)\b|决定|就用|我们用",
    re.IGNORECASE,
)
_TODO = re.compile(r"\bTODO\b|(?i:\bnext step\b|\bneed to\b|\bstill have to\b)|待办|下一步|需要")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])\s*|\n+")
MAX_HEURISTIC_ITEMS = 30
MAX_HEURISTIC_CHARS = 300


def extract_items_heuristically(messages: Iterable[Any]) -> list[MemoryItem]:
    """Items guessed from keywords in what the user and assistant wrote (no tool output).

    Preferences come only from the user; decisions and todos from either side. One sentence,
    one item; at most MAX_HEURISTIC_ITEMS.
    """
    items: list[MemoryItem] = []
    for message in messages:
        from_user = is_user_request(message)
        if not from_user and not (is_message(message) and message["role"] == "assistant"):
            continue
        for sentence in _sentences(message_text(message)):
            item = _classify(sentence, from_user)
            if item is not None and item not in items:
                items.append(item)
            if len(items) >= MAX_HEURISTIC_ITEMS:
                return items
    return items


def _sentences(text: str) -> list[str]:
    prose = re.sub(r"```.*?(?:```|$)", " ", text, flags=re.DOTALL)
    return [
        s.strip() for s in _SENTENCE_END.split(prose) if 6 <= len(s.strip()) <= MAX_HEURISTIC_CHARS
    ]


def _classify(sentence: str, from_user: bool) -> MemoryItem | None:
    if from_user and _PREFERENCE.search(sentence):
        return MemoryItem("preference", sentence)
    if _DECISION.search(sentence):
        return MemoryItem("decision", sentence)
    if _TODO.search(sentence):
        return MemoryItem("todo", sentence)
    return None


# ---------------------------------------------------------------- the file


def normalized(content: str) -> str:
    """What two items must share to count as the same: case, spacing and end punctuation aside."""
    return _WHITESPACE.sub(" ", content).strip().rstrip(".。!！").casefold()


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
    ) -> None:
        self.root = Path(root_dir)
        self._now = now
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
        return [MemoryItem(_as_type(r["type"]), r["content"]) for r in records]

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
                key = (item.type, normalized(item.content))
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
                    await asyncio.to_thread(_append_lines, path, records)
                except BaseException:
                    # Not written: a later flush may try these again.
                    for record in records:
                        seen.discard((record["type"], normalized(record["content"])))
                    raise
            return records


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
            keys.add((str(record.get("type")), normalized(record["content"])))
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
