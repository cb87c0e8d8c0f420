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

With a shared store of records (`state.backend: redis`, proxy.state.redis_records) every change
is also handed to it, as one `SessionChange`, and the admin routes read it (`read_*`): every
replica shows the fleet's sessions. Without one, or while it cannot answer, they read the
process's own.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from proxy.http.keys import TimelineLine
from proxy.state.roles import SessionChange, SessionTotals, SharedRecords

log = logging.getLogger(__name__)

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

    @property
    def records_kept(self) -> int:
        return len(self.records)


class _Figures(Protocol):
    """A session's figures, the process's own (_Session) or the shared records' (SessionTotals):
    what a summary shows and a page sorts by."""

    @property
    def first_seen(self) -> float: ...
    @property
    def last_seen(self) -> float: ...
    @property
    def requests(self) -> int: ...
    @property
    def records_total(self) -> int: ...
    @property
    def records_kept(self) -> int: ...
    @property
    def dialect(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def window(self) -> int | None: ...
    @property
    def tokens_sent(self) -> int: ...
    @property
    def tokens_forwarded(self) -> int: ...
    @property
    def summarizer_calls(self) -> int: ...
    @property
    def summarizer_failures(self) -> int: ...
    @property
    def pinned_overflow(self) -> int: ...


class SessionRecords:
    def __init__(
        self,
        *,
        max_sessions: int,
        records_per_session: int,
        max_bytes: int | None = None,
        preview_chars: int = 400,
        clock: Callable[[], float] = time.time,
        shared: SharedRecords | None = None,
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
        self._shared = shared
        self._unreadable = False  # said once per outage of the shared records

    def touch(self, session_id: str) -> None:
        """Count one request of `session_id` and mark it as just seen."""
        self._session(session_id).requests += 1
        if self._shared is not None:
            self._shared.add(session_id, _ONE_REQUEST, self._clock())

    def add_record(self, session_id: str, record: Record) -> None:
        session = self._session(session_id)
        change = _record_change(record)
        if self._shared is not None:
            self._shared.add(session_id, change, session.last_seen)
        size = 2 * len(orjson.dumps(record, default=repr))
        session.records.append(record)
        session.record_sizes.append(size)
        self._grow(session, size)
        session.records_total += change.records
        session.model = change.model or session.model
        session.window = change.window or session.window
        session.summarizer_calls += change.summarizer_calls
        session.summarizer_failures += change.summarizer_failures
        session.pinned_overflow += change.pinned_overflow
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
        before, after = (
            (None, None) if outcome is None else (outcome.tokens_before, outcome.tokens_after)
        )
        if before is None or after is None:  # forwarded without an estimate: not counted
            before = after = 0
        session.tokens_sent += before
        session.tokens_forwarded += after
        if self._shared is not None:
            change = SessionChange(
                tokens_sent=before,
                tokens_forwarded=after,
                dialect=dialect,
                timeline=_timeline_document(line),
            )
            self._shared.add(session_id, change, session.last_seen)
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
        sort = sort if sort in SORTABLE else "last_seen"
        # Ids (plain strings) and sort keys (numbers, strings) only: a page over thousands of
        # sessions allocates nothing the garbage collector tracks, so it triggers no collection
        # of a heap that holds every session's timeline.
        sessions = self._sessions
        needle = search.casefold()
        if sort == "last_seen" and descending and not needle:
            # The dashboard's first page: the sessions are kept in that order already, so only
            # the page is read, however many sessions there are.
            shown = list(itertools.islice(reversed(sessions), offset, offset + limit))
            total = len(sessions)
        else:
            ids = [
                sid
                for sid, s in sessions.items()
                if not needle or needle in f"{sid} {s.dialect or ''} {s.model or ''}".casefold()
            ]
            key = _SORT_KEYS[sort]
            ids.sort(key=lambda sid: key(sid, sessions[sid]), reverse=descending)
            shown, total = ids[offset : offset + limit], len(ids)
        return {
            "sessions": [_summary(sid, sessions[sid]) for sid in shown],
            "total": total,
            "offset": offset,
            "limit": limit,
        }

    async def read_page(
        self,
        *,
        sort: str = "last_seen",
        descending: bool = True,
        search: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> Record:
        """`page` over the shared records when there are (every replica's sessions), else (or
        while they cannot answer) over the process's own."""
        if self._shared is not None:
            try:
                page = await self._shared_page(sort, descending, search, offset, limit)
                self._unreadable = False
                return page
            except Exception as exc:
                self._say_unreadable(exc)
        return self.page(
            sort=sort, descending=descending, search=search, offset=offset, limit=limit
        )

    async def read_list(self) -> Record:
        """`list` over the shared records when there are, else over the process's own."""
        if self._shared is not None:
            try:
                shown = await self._shared.every()
            except Exception as exc:
                self._say_unreadable(exc)
            else:
                self._unreadable = False
                sessions = [_summary(sid, totals) for sid, totals in shown]
                return {"sessions": sessions, "count": len(sessions)}
        return self.list()

    async def read_session(self, session_id: str, *, timeline: bool = True) -> Record | None:
        """A session's summary, compaction records and (unless `timeline` is False) timeline,
        documents oldest first: from the shared records when there are, else from the
        process's own."""
        if self._shared is not None:
            try:
                found = await self._shared.session(session_id)
            except Exception as exc:
                self._say_unreadable(exc)
            else:
                self._unreadable = False
                if found is None:
                    return None
                # Each replica sends its lines a moment after its answers: a conversation's next
                # request, answered by another replica meanwhile, may land first. Their times
                # (ISO 8601, UTC, one format each) put them back in order.
                shown = {
                    **_summary(session_id, found.totals),
                    "records": sorted(found.records, key=_time_of),
                }
                if timeline:
                    shown["timeline"] = sorted(found.timeline, key=_time_of)
                return shown
        summary = self.get(session_id)
        if summary is None or not timeline:
            return summary
        return {**summary, "timeline": self.timeline(session_id) or []}

    def _say_unreadable(self, error: Exception) -> None:
        """Once until the shared records answer again: every /admin call meanwhile shows the
        process's own."""
        if not self._unreadable:
            self._unreadable = True
            log.warning(
                "shared session records unreadable, showing this process's",
                extra={"error": repr(error)},
            )

    async def _shared_page(
        self, sort: str, descending: bool, search: str, offset: int, limit: int
    ) -> Record:
        assert self._shared is not None
        sort = sort if sort in SORTABLE else "last_seen"
        if sort == "last_seen" and descending and not search:
            # The shared store's own order: only the page is read.
            shown, total = await self._shared.newest(offset, limit)
        else:
            every = _matching(await self._shared.every(), search.casefold())
            key = _SORT_KEYS[sort]
            every.sort(key=lambda pair: key(*pair), reverse=descending)
            shown, total = every[offset : offset + limit], len(every)
        return {
            "sessions": [_summary(sid, totals) for sid, totals in shown],
            "total": total,
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
        sessions = [_summary(sid, s) for sid, s in reversed(self._sessions.items())]
        return {"sessions": sessions, "count": len(sessions)}

    def get(self, session_id: str) -> Record | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return {**_summary(session_id, session), "records": list(session.records)}

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


def _summary(session_id: str, session: _Figures) -> Record:
    return {
        "session_id": session_id,
        "first_seen": _iso(session.first_seen),
        "last_seen": _iso(session.last_seen),
        "requests": session.requests,
        "records_total": session.records_total,
        "records_kept": session.records_kept,
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


def _matching(
    sessions: Iterable[tuple[str, SessionTotals]], needle: str
) -> list[tuple[str, SessionTotals]]:
    """The sessions whose id, dialect or model contain `needle` (casefolded; "": all)."""
    return [
        (sid, s)
        for sid, s in sessions
        if not needle or needle in f"{sid} {s.dialect or ''} {s.model or ''}".casefold()
    ]


_ONE_REQUEST = SessionChange(requests=1)


def _time_of(document: Record) -> str:
    return str(document.get("time", ""))


def _record_change(record: Record) -> SessionChange:
    """What a compaction's record adds to its session: the model and window it ran at, a
    summarizer call when it took the model's path or failed, the standing instructions that
    found no room."""
    errors = bool(record.get("errors"))
    overflow = record.get("pinned_overflow")
    return SessionChange(
        records=1,
        summarizer_calls=int(record.get("path") == "llm" or errors),
        summarizer_failures=int(errors),
        pinned_overflow=overflow if isinstance(overflow, int) else 0,
        model=record.get("model") or None,
        window=record.get("window") or None,
        record=record,
    )


# One per field of SORTABLE (tests/proxy/admin/test_records.py checks).
_SORT_KEYS: dict[str, Callable[[str, _Figures], Any]] = {
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
