"""The records kept for /admin (proxy.admin.records)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.admin.records import SORTABLE, TIMELINE_FIELDS, SessionRecords
from proxy.http.keys import TimelineLine
from proxy.outcome import Outcome, RecallFigures

_DEFAULTS = {
    "time": 1_700_000_000.0, "dialect": "chat", "status": "none", "tokens_before": None,
    "tokens_after": None, "bytes_before": 0, "bytes_after": 0, "compaction_id": None,
    "upstream_status": 200, "overhead_ms": 0.0, "recall_rounds": 0, "recall_tokens": 0,
}  # fmt: skip


def line(**fields: Any) -> TimelineLine:
    """A timeline line whose document has these fields, the others at their defaults."""
    values = {**_DEFAULTS, **fields}
    outcome = Outcome(
        values["status"],
        None,
        values["tokens_before"],
        values["tokens_after"],
        values["compaction_id"],
    )
    recall = RecallFigures(values["recall_rounds"], values["recall_tokens"], 0.0)
    return (
        values["time"],
        values["dialect"],
        outcome,
        recall,
        values["bytes_before"],
        values["bytes_after"],
        values["upstream_status"],
        values["overhead_ms"],
    )


def test_session_records_are_bounded() -> None:
    records = SessionRecords(max_sessions=2, records_per_session=3)
    for sid in ("a", "b", "a", "c"):
        records.touch(sid)
    assert [s["session_id"] for s in records.list()["sessions"]] == ["c", "a"]
    for i in range(5):
        records.add_record("a", {"n": i})
    got = records.get("a")
    assert got is not None
    assert [r["n"] for r in got["records"]] == [2, 3, 4]
    assert got["records_total"] == 5 and got["requests"] == 2
    assert records.get("b") is None


def test_the_records_of_all_sessions_are_bounded_in_bytes_least_recently_seen_first() -> None:
    # Counts alone bounded nothing useful: a compaction's record with its receipt and diff is
    # 10-60 KB, so 10,000 sessions of 50 records each could hold tens of GB.
    receipt = {"summary": "s" * 10_000}  # ~20 KB held, estimated
    records = SessionRecords(max_sessions=100, records_per_session=50, max_bytes=100_000)
    for sid in ("a", "b", "c", "d"):
        records.add_record(sid, receipt)
    assert [s["session_id"] for s in records.list()["sessions"]] == ["d", "c", "b", "a"]
    records.add_record("a", receipt)  # seen again, it holds more: b, least recently seen, goes
    assert [s["session_id"] for s in records.list()["sessions"]] == ["a", "d", "c"]
    records.add_record("e", receipt)
    assert [s["session_id"] for s in records.list()["sessions"]] == ["e", "a", "d"]
    for _ in range(10):  # one session alone past the bound keeps itself, the others go
        records.add_record("e", receipt)
    assert [s["session_id"] for s in records.list()["sessions"]] == ["e"]
    for n in range(1000):  # its oldest records make room as before; nothing grows past them
        records.add_request("e", line(bytes_before=n))
    found = records.get("e")
    assert found is not None and found["records_kept"] == 11
    timeline = records.timeline("e")
    assert timeline is not None and len(timeline) == 50 and timeline[-1]["bytes_before"] == 999
    records.add_request("f", line())
    assert [s["session_id"] for s in records.list()["sessions"]] == ["f"]


def test_a_page_of_sessions_is_sorted_filtered_and_bounded() -> None:
    now = [1000.0]
    records = SessionRecords(max_sessions=100, records_per_session=3, clock=lambda: now[0])
    for i in range(10):
        now[0] += 1
        records.add_request(f"s{i}", line(tokens_before=100 * i, tokens_after=10 * i))
    now[0] += 1
    records.add_record("s3", {"dialect": "messages", "model": "claude-x", "path": "llm"})
    records.add_record("s3", {"model": "claude-x", "path": "extractive", "errors": ["timeout"]})
    page = records.page(sort="tokens_saved", limit=3)
    assert [s["session_id"] for s in page["sessions"]] == ["s9", "s8", "s7"]
    assert page["total"] == 10 and page["sessions"][0]["tokens_saved"] == 810
    second = records.page(sort="tokens_saved", descending=False, offset=3, limit=3)
    assert [s["session_id"] for s in second["sessions"]] == ["s3", "s4", "s5"]
    claude = records.page(search="CLAUDE")
    (only,) = claude["sessions"]
    # The session's dialect is its requests' route; a record's own name stays in the record.
    assert only["session_id"] == "s3" and only["dialect"] == "chat"
    assert only["summarizer_calls"] == 2 and only["summarizer_failures"] == 1
    assert records.page(sort="nonsense", limit=1)["sessions"][0]["session_id"] == "s3"


def test_a_timeline_keeps_the_last_requests_and_counts_them_all() -> None:
    records = SessionRecords(max_sessions=10, records_per_session=2)
    for i in range(5):
        records.add_request("a", line(tokens_before=10, tokens_after=5, overhead_ms=i + 0.004))
    records.add_request("a", line(time=1_700_000_000.25, overhead_ms=5.0))
    timeline = records.timeline("a")
    assert timeline is not None and len(timeline) == 2
    # A line becomes a document when read: its time in ISO 8601, its overhead rounded.
    assert timeline[0]["overhead_ms"] == 4.0 and timeline[0]["tokens_before"] == 10
    assert timeline[1]["time"] == "2023-11-14T22:13:20.250+00:00"
    assert list(timeline[1]) == list(TIMELINE_FIELDS)
    found = records.get("a")
    assert found is not None and found["tokens_sent"] == 50 and found["tokens_forwarded"] == 25
    assert records.overhead_quantiles() == {"p50": 2.004, "p99": 5.0}
    assert records.timeline("nobody") is None


@pytest.mark.parametrize("field", sorted(SORTABLE))
def test_every_sortable_field_orders_a_page(field: str) -> None:
    now = [1000.0]
    records = SessionRecords(max_sessions=100, records_per_session=5, clock=lambda: now[0])
    for i, sid in enumerate(("m", "c", "x", "a", "q")):
        now[0] += 1
        for _ in range(i % 3 + 1):
            records.touch(sid)
        dialect = "chat" if i % 2 else "responses"
        records.add_request(sid, line(dialect=dialect, tokens_before=7 * i, tokens_after=i))
        for _ in range(i % 2 + 1):
            record = {"model": f"model-{4 - i}", "path": "llm" if i < 3 else "extractive"}
            records.add_record(sid, {**record, "errors": ["e"] * (i % 2)})
    shown = [s[field] for s in records.page(sort=field, descending=False)["sessions"]]
    assert shown == sorted(shown) and len(set(shown)) > 1


def test_the_first_page_is_the_most_recently_seen_sessions_read_without_sorting_them_all() -> None:
    now = [1000.0]
    records = SessionRecords(max_sessions=100, records_per_session=5, clock=lambda: now[0])
    for sid in ("a", "b", "c", "d", "b", "e", "a"):
        now[0] += 1
        records.touch(sid)
    first = records.page(limit=2)
    assert [s["session_id"] for s in first["sessions"]] == ["a", "e"] and first["total"] == 5
    rest = records.page(offset=2, limit=10)["sessions"]
    oldest_first = records.page(descending=False)["sessions"]  # sorted by last_seen
    assert [s["session_id"] for s in first["sessions"] + rest] == [
        s["session_id"] for s in reversed(oldest_first)
    ]
