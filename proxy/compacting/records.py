"""The records of compactions: each counted in the metrics, kept for /admin, logged once.

`SessionRecords` keeps per-session counters and compaction records for /admin (built in
app.create_app, read by proxy.http.admin), bounded three ways: at most `max_sessions` sessions
and `max_bytes` of them all (least recently seen evicted first), `records_per_session` records
each (oldest dropped first). Records are plain JSON-able dicts. Each session also keeps a timeline of its
last hooked requests (as many as records) and running totals (tokens as sent and as forwarded,
summarizer calls and failures) for the dashboard (proxy.http.dashboard), which pages through
them with `page`.

A compaction's record is also its receipt on the dashboard: the summary as sent, the memory
items written, and the diff between the view as sent and as forwarded (the messages replaced and
the ones that replaced them, each a role and a preview), all bounded so a record stays small.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from compaction import Checkpoint, CompactionResult, View
from proxy.http.sessions import SORTABLE, TIMELINE_FIELDS, TimelineLine
from proxy.metrics import CompactionMetrics

Record = dict[str, Any]
"""A JSON-able document for /admin: one compaction's record, or a session's summary."""

if TYPE_CHECKING:  # a request's parts are only read here; keys.py imports this module
    from proxy.compacting.request import ParsedRequest

log = logging.getLogger(__name__)

# How many of the last hooked requests the overhead quantiles are taken over.
_RECENT_OVERHEADS = 1000
# The receipt's bounds: the summary as sent, the memory items, the diff's messages per side
# (the first and last halves of them, with how many were left out), and each preview.
RECEIPT_SUMMARY_CHARS = 8000
RECEIPT_MEMORY_ITEMS = 50
RECEIPT_DIFF_MESSAGES = 40
RECEIPT_PREVIEW_CHARS = 240
# What the records hold in memory, estimated without walking them (tracemalloc, CPython 3.11): a
# timeline line ~310 B; a compaction record about twice its JSON (a 40-message diff's previews
# and a receipt's summary: 10-50 KB); a session's counters ~1 KB.
_TIMELINE_LINE_BYTES = 320
_SESSION_BYTES = 1024


@dataclass(slots=True)
class _Session:
    first_seen: float
    last_seen: float
    requests: int = 0
    records_total: int = 0
    records: deque[Record] = field(default_factory=deque)
    record_sizes: deque[int] = field(default_factory=deque)
    timeline: deque[TimelineLine] = field(default_factory=deque)
    size: int = _SESSION_BYTES
    dialect: str | None = None
    model: str | None = None
    window: int | None = None
    tokens_sent: int = 0
    tokens_forwarded: int = 0
    summarizer_calls: int = 0
    summarizer_failures: int = 0
    pinned_overflow: int = 0


class SessionRecords:
    def __init__(
        self,
        *,
        max_sessions: int,
        records_per_session: int,
        max_bytes: int | None = None,
        preview_chars: int = 400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.preview_chars = preview_chars
        """How much of each summary a record shows (admin.preview_chars; 0: none)."""
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._held = 0  # the sessions' estimated sizes, summed
        self._per_session = records_per_session
        self._clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._overheads: deque[float] = deque(maxlen=_RECENT_OVERHEADS)

    def touch(self, session_id: str) -> None:
        """Count one request of `session_id` and mark it as just seen."""
        self._session(session_id).requests += 1

    def add_record(self, session_id: str, record: Record) -> None:
        session = self._session(session_id)
        size = 2 * len(orjson.dumps(record, default=repr))
        session.records.append(record)
        session.record_sizes.append(size)
        self._grow(session, size)
        session.records_total += 1
        session.model = record.get("model") or session.model
        session.window = record.get("window") or session.window
        if record.get("path") == "llm" or record.get("errors"):
            session.summarizer_calls += 1
        if record.get("errors"):
            session.summarizer_failures += 1
        overflow = record.get("pinned_overflow")
        if isinstance(overflow, int):
            session.pinned_overflow += overflow
        while len(session.records) > self._per_session:
            session.records.popleft()
            self._grow(session, -session.record_sizes.popleft())
        self._evict()

    def add_request(self, session_id: str, line: TimelineLine) -> None:
        """One hooked request's line in the session's timeline; its dialect is the session's
        from then on, its tokens (when it was counted) add to the session's totals."""
        session = self._session(session_id)
        _, dialect, _, before, after, _, _, _, _, overhead_ms, _, _ = line
        session.dialect = dialect
        if before is not None and after is not None:
            session.tokens_sent += before
            session.tokens_forwarded += after
        session.timeline.append(line)
        self._overheads.append(overhead_ms)
        if len(session.timeline) > self._per_session:
            session.timeline.popleft()
        else:
            self._grow(session, _TIMELINE_LINE_BYTES)
            self._evict()

    def page(
        self,
        *,
        sort: str = "last_seen",
        descending: bool = True,
        search: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> Record:
        """One page of session summaries: those whose id, dialect or model contain `search`
        (case aside), ordered by the summary field `sort` (one of SORTABLE)."""
        if sort not in SORTABLE:
            sort = "last_seen"
        # Ids (plain strings) and sort keys (numbers, strings) only: a page over thousands of
        # sessions allocates nothing the garbage collector tracks, so it triggers no collection
        # of a heap that holds every session's timeline.
        sessions = self._sessions
        needle = search.casefold()
        ids = [
            sid
            for sid, s in sessions.items()
            if not needle or needle in f"{sid} {s.dialect or ''} {s.model or ''}".casefold()
        ]
        key = _SORT_KEYS[sort]
        ids.sort(key=lambda sid: key(sid, sessions[sid]), reverse=descending)
        shown = ids[offset : offset + limit]
        return {
            "sessions": [self._summary(sid, sessions[sid]) for sid in shown],
            "total": len(ids),
            "offset": offset,
            "limit": limit,
        }

    def overhead_quantiles(self) -> dict[str, float | None]:
        """p50 and p99 of the proxy's own time before forwarding, over the last hooked
        requests of every session."""
        ordered = sorted(self._overheads)
        if not ordered:
            return {"p50": None, "p99": None}
        last = len(ordered) - 1
        return {"p50": ordered[round(last * 0.5)], "p99": ordered[round(last * 0.99)]}

    def timeline(self, session_id: str) -> list[Record] | None:
        """The session's last hooked requests, oldest first, each a document: the line's
        fields, its time in ISO 8601 (UTC, milliseconds), its overhead rounded to 0.01 ms."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return [_timeline_document(line) for line in session.timeline]

    def list(self) -> Record:
        """Every session's summary, most recently seen first."""
        sessions = [self._summary(sid, s) for sid, s in reversed(self._sessions.items())]
        return {"sessions": sessions, "count": len(sessions)}

    def get(self, session_id: str) -> Record | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return {**self._summary(session_id, session), "records": list(session.records)}

    def _session(self, session_id: str) -> _Session:
        now = self._clock()
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(first_seen=now, last_seen=now)
            self._held += session.size
            while len(self._sessions) > self._max_sessions:
                self._forget_oldest()
        else:
            session.last_seen = now
            self._sessions.move_to_end(session_id)
        return session

    def _grow(self, session: _Session, size: int) -> None:
        session.size += size
        self._held += size

    def _evict(self) -> None:
        """The least recently seen sessions go while all of them hold more than max_bytes (the
        one just seen stays, whatever its size)."""
        if self._max_bytes is None:
            return
        while self._held > self._max_bytes and len(self._sessions) > 1:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        _, session = self._sessions.popitem(last=False)
        self._held -= session.size

    @staticmethod
    def _summary(session_id: str, session: _Session) -> Record:
        return {
            "session_id": session_id,
            "first_seen": _iso(session.first_seen),
            "last_seen": _iso(session.last_seen),
            "requests": session.requests,
            "records_total": session.records_total,
            "records_kept": len(session.records),
            "dialect": session.dialect,
            "model": session.model,
            "window": session.window,
            "tokens_sent": session.tokens_sent,
            "tokens_forwarded": session.tokens_forwarded,
            "tokens_saved": session.tokens_sent - session.tokens_forwarded,
            "summarizer_calls": session.summarizer_calls,
            "summarizer_failures": session.summarizer_failures,
            # Standing instructions with no room in the summaries' pinned sections (in the
            # memory file), over the session's compactions.
            "pinned_overflow": session.pinned_overflow,
        }


# One per field of proxy.http.sessions.SORTABLE (tests/proxy/compacting/test_records.py checks).
_SORT_KEYS: dict[str, Callable[[str, _Session], Any]] = {
    "session_id": lambda sid, s: sid,
    "last_seen": lambda sid, s: s.last_seen,
    "first_seen": lambda sid, s: s.first_seen,
    "requests": lambda sid, s: s.requests,
    "records_total": lambda sid, s: s.records_total,
    "dialect": lambda sid, s: s.dialect or "",
    "model": lambda sid, s: s.model or "",
    "tokens_sent": lambda sid, s: s.tokens_sent,
    "tokens_forwarded": lambda sid, s: s.tokens_forwarded,
    "tokens_saved": lambda sid, s: s.tokens_sent - s.tokens_forwarded,
    "summarizer_calls": lambda sid, s: s.summarizer_calls,
    "summarizer_failures": lambda sid, s: s.summarizer_failures,
}


def _timeline_document(line: TimelineLine) -> Record:
    document: Record = dict(zip(TIMELINE_FIELDS, line, strict=True))
    document["time"] = datetime.fromtimestamp(line[0], UTC).isoformat(timespec="milliseconds")
    document["overhead_ms"] = round(line[9], 2)
    return document


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


def record_compaction(
    records: SessionRecords,
    metrics: CompactionMetrics,
    request: ParsedRequest,
    view: View,
    result: CompactionResult,
    *,
    reason: str,
    checkpoint: Checkpoint | None,
    fits: bool,
    waited: str | None = None,
) -> None:
    """Count one compaction, add its record to the session's /admin records, log one line.
    `fits`: whether the compacted view goes out as it is (below the request's trigger);
    `waited`: why a request waited for this compaction (None: none did, it was prepared
    ahead)."""
    metrics.compactions.labels(reason=reason, path=result.path, dialect=request.dialect.name).inc()
    if result.path != "unchanged":
        metrics.tokens_saved.inc(max(0, result.tokens_before - result.tokens_after))
    metrics.pinned_overflow.inc(result.pinned_overflow)
    verification = result.verification
    texts = records.preview_chars > 0  # 0: what conversations say stays out of /admin
    receipt = {  # the dashboard's receipt
        "summary": result.summary_text[:RECEIPT_SUMMARY_CHARS] if texts else "",
        "memory_written": [
            {
                "type": item.type,
                "content": item.content[:RECEIPT_PREVIEW_CHARS] if texts else "",
            }
            for item in result.memory_items[:RECEIPT_MEMORY_ITEMS]
        ],
        "diff": describe_diff(view.messages, result, texts=texts),
    }
    records.add_record(
        request.session_id,
        {
            "id": result.compaction_id,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "reason": reason,
            "path": result.path,
            "strategy": result.strategy,
            "previews": len(result.previews),
            "model_calls": result.model_calls,
            "detail": result.reason,
            "dialect": request.dialect.name,
            "model": request.model,
            "window": request.window,
            "window_source": request.window_source,
            "messages_before": len(view.messages),
            "messages_after": len(result.messages),
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "folded_messages": result.folded_count,
            "folded_range": folded_range(view, checkpoint),
            "extends": view.base.compaction_id if view.base else None,
            "summary_chars": len(result.summary_text),
            "summary_preview": result.summary_text[: records.preview_chars],
            "memory_items": len(result.memory_items),
            "quality": verification.quality if verification else None,
            "key_decisions_preserved": verification.key_decisions_preserved
            if verification
            else None,
            "key_decisions_total": verification.key_decisions_total if verification else None,
            "moved_to_memory": verification.moved_to_memory if verification else None,
            "pinned_overflow": result.pinned_overflow,
            "fits": fits,
            "waited": waited,
            "duration_ms": round(result.duration_s * 1000, 1),
            "errors": list(result.errors),
            **receipt,
        },
    )
    # A summarizer that failed (the compaction fell back) is a warning, with why. Ids and counts
    # only: what the conversation says (the receipt) stays out of logs (logging.dump_dir has it).
    log.log(
        logging.WARNING if result.errors else logging.INFO,
        "compaction %s",
        result.path,
        extra={
            "session": request.session_id,
            "reason": reason,
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "compaction_id": result.compaction_id,
            "waited": waited,
            "errors": list(result.errors),
            "summary_chars": len(result.summary_text),
            "memory_items": len(result.memory_items),
            "folded_messages": result.folded_count,
        },
    )


def folded_range(view: View, checkpoint: Checkpoint | None) -> list[int] | None:
    """Original message indices [start, end) this compaction folded (or reduced to previews)
    for the first time."""
    if checkpoint is None:
        return None
    base = view.base
    start = base.cut if base is not None else checkpoint.head_end
    if checkpoint.previews:  # a reduced output may lie before the base's cut
        before = {i for i, _ in base.previews} if base is not None else set()
        start = min([start, *(i for i, _ in checkpoint.previews if i not in before)])
    return [start, checkpoint.cut]


def describe_diff(
    sent: Sequence[dict[str, Any]], result: CompactionResult, *, texts: bool = True
) -> dict[str, Any]:
    """What the compaction changed: `result.messages[:prefix_len]` replaced `sent[:keep_from]`
    and the rest went on untouched (compaction.CompactionResult); of the replaced part, the
    opening both sides share (the system prompt, usually) went on unchanged too. Indices are
    positions in the messages as sent and as forwarded; without `texts`, previews are empty."""
    if result.path == "unchanged":
        return {"removed": [], "added": [], "removed_total": 0, "added_total": 0, "kept": len(sent)}
    replaced, replacing = sent[: result.keep_from], result.messages[: result.prefix_len]
    same = 0
    while same < min(len(replaced), len(replacing)) and replaced[same] == replacing[same]:
        same += 1
    return {
        "removed": _previews(replaced, same, texts),
        "added": _previews(replacing, same, texts),
        "removed_total": len(replaced) - same,
        "added_total": len(replacing) - same,
        "kept": len(sent) - result.keep_from + same,
    }


def _previews(messages: Sequence[dict[str, Any]], start: int, texts: bool) -> list[dict[str, Any]]:
    """Previews of `messages[start:]`: all of them, or their first and last halves."""
    half = RECEIPT_DIFF_MESSAGES // 2
    end = len(messages)
    if end - start <= RECEIPT_DIFF_MESSAGES:
        indices = [*range(start, end)]
    else:
        indices = [*range(start, start + half), *range(end - half, end)]
    return [_preview(index, messages[index], texts) for index in indices]


def _preview(index: int, message: dict[str, Any], texts: bool) -> dict[str, Any]:
    content = message.get("content")
    if content is None:
        text = ""
    else:
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
    if message.get("tool_calls"):
        calls = orjson.dumps(message["tool_calls"]).decode()[:RECEIPT_PREVIEW_CHARS]
        text = f"{text} {calls}" if text else calls
    return {
        "index": index,
        "role": str(message.get("role", "")),
        "chars": len(text),
        "preview": text[:RECEIPT_PREVIEW_CHARS] if texts else "",
    }
