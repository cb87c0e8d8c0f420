"""Sessions: who a request belongs to (DESIGN §5), and what the proxy remembers about each.

Identity: `X-Session-Id`, then the `/s/{session}/` path, then (decided by the hook, which parses
the body) a fingerprint of the conversation's opening.

Ids become directory names under `memory.dir`, so they are validated strictly here: the
pattern leaves no room for separators, and a leading dot is refused (no `.`, `..`, hidden dirs).

`SessionRecords` keeps per-session counters and compaction records for /admin, bounded in both
directions: at most `max_sessions` sessions (least recently seen evicted first) and
`records_per_session` records each (oldest dropped first). Records are plain JSON-able dicts.
Each session also keeps a timeline of its last hooked requests (as many as records) and running
totals (tokens as sent and as forwarded, summarizer calls and failures) for the dashboard
(proxy.http.dashboard), which pages through them with `page`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from compaction import is_valid_session_id
from proxy.errors import SessionIdRefused

SESSION_HEADER = "X-Session-Id"
# How many of the last hooked requests the overhead quantiles are taken over.
_RECENT_OVERHEADS = 1000


def check_session_id(value: str, source: str) -> str:
    """`value` if it is a valid id; SessionIdRefused (400) naming `source` otherwise."""
    if not is_valid_session_id(value):
        raise SessionIdRefused(
            f"invalid session id in {source}: use 1-128 characters from [A-Za-z0-9._-], "
            "not starting with a dot"
        )
    return value


def resolve_session_id(headers: Mapping[str, str], path_session: str | None) -> str | None:
    """The explicit session id of a request (header first, then path), validated; None if the
    request names none. Both are checked when both are present: a bad id is a bad request."""
    header = headers.get(SESSION_HEADER)
    if path_session is not None:
        check_session_id(path_session, "the path")
    if header is not None:
        return check_session_id(header, f"the {SESSION_HEADER} header")
    return path_session


@dataclass(slots=True)
class _Session:
    first_seen: float
    last_seen: float
    requests: int = 0
    records_total: int = 0
    records: deque[dict[str, Any]] = field(default_factory=deque)
    timeline: deque[dict[str, Any]] = field(default_factory=deque)
    dialect: str | None = None
    model: str | None = None
    window: int | None = None
    tokens_sent: int = 0
    tokens_forwarded: int = 0
    summarizer_calls: int = 0
    summarizer_failures: int = 0


class SessionRecords:
    def __init__(
        self,
        *,
        max_sessions: int,
        records_per_session: int,
        preview_chars: int = 400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.preview_chars = preview_chars
        """How much of each summary a record shows (admin.preview_chars; 0: none)."""
        self._max_sessions = max_sessions
        self._per_session = records_per_session
        self._clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._overheads: deque[float] = deque(maxlen=_RECENT_OVERHEADS)

    def touch(self, session_id: str) -> None:
        """Count one request of `session_id` and mark it as just seen."""
        self._session(session_id).requests += 1

    def add_record(self, session_id: str, record: dict[str, Any]) -> None:
        session = self._session(session_id)
        session.records.append(record)
        session.records_total += 1
        session.model = record.get("model") or session.model
        session.window = record.get("window") or session.window
        if record.get("path") == "llm" or record.get("errors"):
            session.summarizer_calls += 1
        if record.get("errors"):
            session.summarizer_failures += 1
        while len(session.records) > self._per_session:
            session.records.popleft()

    def add_request(self, session_id: str, entry: dict[str, Any]) -> None:
        """One hooked request's line in the session's timeline: its `dialect` (the route's API
        shape: chat, responses, messages; the session's from then on), and
        `tokens_before` / `tokens_after` when the request was counted (None when it was
        forwarded without being parsed: then it was far below the trigger)."""
        session = self._session(session_id)
        session.dialect = entry.get("dialect") or session.dialect
        before, after = entry.get("tokens_before"), entry.get("tokens_after")
        if isinstance(before, int) and isinstance(after, int):
            session.tokens_sent += before
            session.tokens_forwarded += after
        session.timeline.append(entry)
        overhead = entry.get("overhead_ms")
        if isinstance(overhead, int | float):
            self._overheads.append(float(overhead))
        while len(session.timeline) > self._per_session:
            session.timeline.popleft()

    def page(
        self,
        *,
        sort: str = "last_seen",
        descending: bool = True,
        search: str = "",
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
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

    def timeline(self, session_id: str) -> list[dict[str, Any]] | None:
        session = self._sessions.get(session_id)
        return None if session is None else list(session.timeline)

    def list(self) -> dict[str, Any]:
        """Every session's summary, most recently seen first."""
        sessions = [self._summary(sid, s) for sid, s in reversed(self._sessions.items())]
        return {"sessions": sessions, "count": len(sessions)}

    def get(self, session_id: str) -> dict[str, Any] | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return {**self._summary(session_id, session), "records": list(session.records)}

    def _session(self, session_id: str) -> _Session:
        now = self._clock()
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(first_seen=now, last_seen=now)
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        else:
            session.last_seen = now
            self._sessions.move_to_end(session_id)
        return session

    @staticmethod
    def _summary(session_id: str, session: _Session) -> dict[str, Any]:
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
        }


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
SORTABLE = frozenset(_SORT_KEYS)
"""The summary fields a page of sessions may be ordered by."""


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
