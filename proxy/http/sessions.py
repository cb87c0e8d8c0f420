"""Sessions: who a request belongs to (DESIGN §5), and what the proxy remembers about each.

Identity: `X-Session-Id`, then the `/s/{session}/` path, then (decided by the hook, which parses
the body) a fingerprint of the conversation's opening.

Ids become directory names under `memory.dir`, so they are validated strictly here: the
pattern leaves no room for separators, and a leading dot is refused (no `.`, `..`, hidden dirs).

`SessionRecords` keeps per-session counters and compaction records for /admin, bounded in both
directions: at most `max_sessions` sessions (least recently seen evicted first) and
`records_per_session` records each (oldest dropped first). Records are plain JSON-able dicts.
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


@dataclass
class _Session:
    first_seen: float
    last_seen: float
    requests: int = 0
    records_total: int = 0
    records: deque[dict[str, Any]] = field(default_factory=deque)


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

    def touch(self, session_id: str) -> None:
        """Count one request of `session_id` and mark it as just seen."""
        self._session(session_id).requests += 1

    def add_record(self, session_id: str, record: dict[str, Any]) -> None:
        session = self._session(session_id)
        session.records.append(record)
        session.records_total += 1
        while len(session.records) > self._per_session:
            session.records.popleft()

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
        }


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")
