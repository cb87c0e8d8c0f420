"""The records of compactions: each counted in the metrics, kept for /admin, logged once.

`SessionRecords` keeps per-session counters and compaction records for /admin (built in
app.create_app, read by proxy.http.admin), bounded in both directions: at most `max_sessions`
sessions (least recently seen evicted first) and `records_per_session` records each (oldest
dropped first). Records are plain JSON-able dicts.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from compaction import Checkpoint, CompactionResult, View
from proxy.metrics import CompactionMetrics

Record = dict[str, Any]
"""A JSON-able document for /admin: one compaction's record, or a session's summary."""

if TYPE_CHECKING:  # a request's parts are only read here; keys.py imports this module
    from proxy.compacting.request import ParsedRequest

log = logging.getLogger(__name__)


@dataclass
class _Session:
    first_seen: float
    last_seen: float
    requests: int = 0
    records_total: int = 0
    records: deque[Record] = field(default_factory=deque)


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

    def add_record(self, session_id: str, record: Record) -> None:
        session = self._session(session_id)
        session.records.append(record)
        session.records_total += 1
        while len(session.records) > self._per_session:
            session.records.popleft()

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
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        else:
            session.last_seen = now
            self._sessions.move_to_end(session_id)
        return session

    @staticmethod
    def _summary(session_id: str, session: _Session) -> Record:
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


def record_compaction(
    records: SessionRecords,
    metrics: CompactionMetrics,
    request: ParsedRequest,
    view: View,
    result: CompactionResult,
    *,
    reason: str,
    checkpoint: Checkpoint | None,
) -> None:
    """Count one compaction, add its record to the session's /admin records, log one line."""
    metrics.compactions.labels(reason=reason, path=result.path, dialect=request.dialect.name).inc()
    if result.path != "unchanged":
        metrics.tokens_saved.inc(max(0, result.tokens_before - result.tokens_after))
    verification = result.verification
    records.add_record(
        request.session_id,
        {
            "id": result.compaction_id,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "reason": reason,
            "path": result.path,
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
            "fits": result.fits,
            "duration_ms": round(result.duration_s * 1000, 1),
            "errors": list(result.errors),
        },
    )
    # A summarizer that failed (the compaction fell back) is a warning, with why.
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
            "errors": list(result.errors),
        },
    )


def folded_range(view: View, checkpoint: Checkpoint | None) -> list[int] | None:
    """Original message indices [start, end) this compaction folded for the first time."""
    if checkpoint is None:
        return None
    start = view.base.cut if view.base is not None else checkpoint.head_end
    return [start, checkpoint.cut]
