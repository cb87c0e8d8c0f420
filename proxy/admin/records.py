"""The records the proxy keeps per session for /admin, the dashboard and `inspect`.

`SessionRecords` keeps per-session counters and compaction records (built in app.create_app,
written by the compacting side, proxy.compacting.decision.records, and by forwarding, read by
the admin routes and the dashboard), bounded three ways: at most `max_sessions` sessions and `max_bytes`
of them all (least recently seen evicted first), `records_per_session` records each (oldest
dropped first). Records are plain JSON-able dicts. Each session also keeps a timeline of its
last hooked requests (as many as records: what forwarding saw, the hook's typed `Outcome`
included; proxy.http.keys.TimelineLine) and running totals (tokens as sent and as forwarded,
summarizer calls and failures) for the dashboard (proxy.admin.dashboard), which pages through
them with `page`. The records are read, never a header.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.http.keys import TimelineLine

Record = dict[str, Any]
"""A JSON-able document for /admin: one compaction's record, or a session's summary."""

SORTABLE = frozenset(
    {
        "session_id", "last_seen", "first_seen", "requests", "records_total", "dialect",
        "model", "tokens_sent", "tokens_forwarded", "tokens_saved", "summarizer_calls",
        "summarizer_failures",
    }
)  # fmt: skip
"""The session summary fields a page of sessions may be ordered by (/admin/api/sessions)."""

TIMELINE_FIELDS = (
    "time", "dialect", "status", "tokens_before", "tokens_after", "bytes_before", "bytes_after",
    "compaction_id", "upstream_status", "overhead_ms", "recall_rounds", "recall_tokens",
)  # fmt: skip
"""The fields of a timeline document, in their order, as the dashboard reads them."""

# How many of the last hooked requests the overhead quantiles are taken over.
_RECENT_OVERHEADS = 1000
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
        _, dialect, outcome, _, _, _, _, overhead_ms = line
        session.dialect = dialect
        if outcome is not None:
            before, after = outcome.tokens_before, outcome.tokens_after
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


# One per field of SORTABLE (tests/proxy/admin/test_records.py checks).
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
    when, dialect, outcome, recall, bytes_before, bytes_after, upstream_status, overhead_ms = line
    return {
        "time": datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds"),
        "dialect": dialect,
        "status": outcome.status if outcome is not None else "none",
        "tokens_before": outcome.tokens_before if outcome is not None else None,
        "tokens_after": outcome.tokens_after if outcome is not None else None,
        "bytes_before": bytes_before,
        "bytes_after": bytes_after,
        "compaction_id": outcome.compaction_id if outcome is not None else None,
        "upstream_status": upstream_status,
        "overhead_ms": round(overhead_ms, 2),
        "recall_rounds": recall.rounds if recall is not None else 0,
        "recall_tokens": recall.tokens if recall is not None else 0,
    }


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
