"""The records kept for /admin (proxy.compacting.records)."""

from __future__ import annotations

from proxy.compacting.records import SessionRecords


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
