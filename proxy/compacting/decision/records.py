"""The records of compactions: each counted in the metrics, kept for /admin (in the session
records, proxy.admin.records), logged once.

A compaction's record is also its receipt on the dashboard: the summary as sent, the memory
items written, and the diff between the view as sent and as forwarded (the messages replaced and
the ones that replaced them, each a role and a preview), all bounded so a record stays small.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from compaction import Checkpoint, CompactionResult, View
from proxy.admin.records import SessionRecords
from proxy.dialects import Dialect
from proxy.metrics import CompactionMetrics

if TYPE_CHECKING:  # a request's parts are only read here
    from proxy.compacting.decision.request import ParsedRequest

log = logging.getLogger(__name__)

# The receipt's bounds: the summary as sent, the memory items, the diff's messages per side
# (the first and last halves of them, with how many were left out), and each preview.
RECEIPT_SUMMARY_CHARS = 8000
RECEIPT_MEMORY_ITEMS = 50
RECEIPT_DIFF_MESSAGES = 40
RECEIPT_PREVIEW_CHARS = 240


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
    mode: str = "on",
) -> None:
    """Count one compaction, add its record to the session's /admin records, log one line.
    `fits`: whether the compacted view goes out as it is (below the request's trigger);
    `waited`: why a request waited for this compaction (None: none did, it was prepared
    ahead); `mode`: compaction.mode, "shadow" when it was only computed and the client's
    request went upstream as sent."""
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
        "diff": describe_diff(view.messages, result, request.dialect, texts=texts),
    }
    records.add_record(
        request.session_id,
        {
            "id": result.compaction_id,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "mode": mode,
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
    for the first time (compaction.Layout.folded_since)."""
    if checkpoint is None:
        return None
    folded = checkpoint.layout.folded_since(view.base.layout if view.base is not None else None)
    return [folded.start, folded.stop]


def describe_diff(
    sent: Sequence[dict[str, Any]],
    result: CompactionResult,
    dialect: Dialect,
    *,
    texts: bool = True,
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
        "removed": _previews(replaced, same, dialect, texts),
        "added": _previews(replacing, same, dialect, texts),
        "removed_total": len(replaced) - same,
        "added_total": len(replacing) - same,
        "kept": len(sent) - result.keep_from + same,
    }


def _previews(
    messages: Sequence[dict[str, Any]], start: int, dialect: Dialect, texts: bool
) -> list[dict[str, Any]]:
    """Previews of `messages[start:]`: all of them, or their first and last halves."""
    half = RECEIPT_DIFF_MESSAGES // 2
    end = len(messages)
    if end - start <= RECEIPT_DIFF_MESSAGES:
        indices = [*range(start, end)]
    else:
        indices = [*range(start, start + half), *range(end - half, end)]
    return [_preview(index, messages[index], dialect, texts) for index in indices]


def _preview(index: int, message: dict[str, Any], dialect: Dialect, texts: bool) -> dict[str, Any]:
    content = message.get("content")
    if content is None:
        text = ""
    else:
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
    outside = dialect.calls_outside_content(message)
    if outside:
        calls = orjson.dumps(outside).decode()[:RECEIPT_PREVIEW_CHARS]
        text = f"{text} {calls}" if text else calls
    return {
        "index": index,
        "role": str(message.get("role", "")),
        "chars": len(text),
        "preview": text[:RECEIPT_PREVIEW_CHARS] if texts else "",
    }
