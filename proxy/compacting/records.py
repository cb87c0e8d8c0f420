"""The record of one compaction: counted in the metrics, kept for /admin, logged once."""

from __future__ import annotations

import datetime as dt
import logging

from compaction import Checkpoint, CompactionResult, View
from proxy.compacting.request import ParsedRequest
from proxy.http.sessions import SessionRecords
from proxy.metrics import CompactionMetrics

log = logging.getLogger(__name__)


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
