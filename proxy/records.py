"""Per-session records served by the admin endpoints, bounded in both directions.

At most `max_sessions` sessions (least recently seen evicted first) and `records_per_session`
records each (oldest dropped first). Records are plain JSON-able dicts: the proxy counts requests,
and the compaction pipeline adds one record per compaction.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


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
        clock: Callable[[], float] = time.time,
    ) -> None:
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
