"""The session's memory items (`{memory.dir}/{session}/compaction_flush.jsonl`, written by the
library's memory writer) searched beside the archive, by the simple term score."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from pathlib import Path

import orjson

from proxy.state.archive.entries import Found
from proxy.state.archive.terms import score_text

MEMORY_FILE = "compaction_flush.jsonl"


def search_memory(
    memory_dir: Path,
    session: str,
    terms: list[str],
    *,
    compactions: Collection[str] | None,
    limit: int,
) -> list[Found]:
    """Best matches first. `compactions`: only the items those compactions wrote (the ones whose
    turns the caller's credential archived); None: every item of the session. Reads a file:
    call it off the event loop."""
    path = memory_dir / session / MEMORY_FILE
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    found: list[Found] = []
    for line in lines:
        item = _item(line)
        if item is None:
            continue
        content, compaction_id, at = item
        if compactions is not None and compaction_id not in compactions:
            continue
        score = score_text(content, terms)
        if score > 0:
            found.append(Found("memory", None, score, content, None, compaction_id, at))
    found.sort(key=lambda item: -item.score)
    return found[:limit]


def _item(line: bytes) -> tuple[str, str, float] | None:
    """Its content, compaction and time; None for a line that is not a memory item."""
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(item, dict) or not isinstance(item.get("content"), str):
        return None
    kind = item.get("type")
    content = f"{kind}: {item['content']}" if isinstance(kind, str) else item["content"]
    compaction_id = item.get("compaction_id")
    return content, compaction_id if isinstance(compaction_id, str) else "", _time(item)


def _time(item: dict[str, object]) -> float:
    stamp = item.get("timestamp")
    if not isinstance(stamp, str):
        return 0.0
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0
