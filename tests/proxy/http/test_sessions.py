"""Session identity rules and the fingerprint of a conversation's opening."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compacting.dialects.chat import CHAT_COMPLETIONS
from proxy.compacting.request import fingerprint as fingerprint_of
from proxy.errors import SessionIdRefused
from proxy.http.sessions import SessionRecords, is_valid_session_id, resolve_session_id


def fingerprint(payload: dict[str, Any]) -> str:
    """The session a chat request that names none gets."""
    messages = payload.get("messages")
    listed = messages if isinstance(messages, list) else []
    return fingerprint_of(CHAT_COMPLETIONS.opening(payload, listed))


def conversation(
    system: str, first: str, *later: str, tools: tuple[str, ...] = ()
) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for text in later:
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
    return {
        "model": "m",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": n}} for n in tools],
    }


@pytest.mark.parametrize("value", ["a", "A.b-c_9", "x" * 128, "fp-0123"])
def test_valid_session_ids(value: str) -> None:
    assert is_valid_session_id(value)


@pytest.mark.parametrize(
    "value", ["", ".", "..", ".a", "a/b", "a\\b", "a b", "é", "x" * 129, "a\n"]
)
def test_invalid_session_ids(value: str) -> None:
    assert not is_valid_session_id(value)


def test_header_wins_over_path_and_both_are_checked() -> None:
    assert resolve_session_id({"X-Session-Id": "h"}, "p") == "h"
    assert resolve_session_id({}, "p") == "p"
    assert resolve_session_id({}, None) is None
    with pytest.raises(SessionIdRefused):
        resolve_session_id({"X-Session-Id": "ok"}, "..")


def test_fingerprint_is_stable_as_the_conversation_grows() -> None:
    start = conversation("sys", "task one", tools=("read", "write"))
    later = conversation("sys", "task one", "more", "even more", tools=("write", "read"))
    assert fingerprint(start) == fingerprint(later)
    assert is_valid_session_id(fingerprint(start))


def test_fingerprint_tells_conversations_of_one_agent_apart() -> None:
    assert fingerprint(conversation("sys", "task one")) != fingerprint(
        conversation("sys", "task two")
    )
    assert fingerprint(conversation("sys", "t")) != fingerprint(conversation("other", "t"))
    assert fingerprint(conversation("s", "t", tools=("a",))) != fingerprint(conversation("s", "t"))


def test_fingerprint_survives_odd_payloads() -> None:
    for payload in (
        {},
        {"messages": "x"},
        {"messages": [1, None, {"role": "user"}]},
        {"tools": [None, {"function": 3}]},
    ):
        assert fingerprint(payload).startswith("fp-")


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


def test_a_page_of_sessions_is_sorted_filtered_and_bounded() -> None:
    now = [1000.0]
    records = SessionRecords(max_sessions=100, records_per_session=3, clock=lambda: now[0])
    for i in range(10):
        now[0] += 1
        records.add_request(
            f"s{i}", {"dialect": "chat", "tokens_before": 100 * i, "tokens_after": 10 * i}
        )
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
        records.add_request(
            "a", {"dialect": "chat", "tokens_before": 10, "tokens_after": 5, "overhead_ms": i}
        )
    records.add_request("a", {"dialect": "chat", "tokens_before": None, "tokens_after": None})
    timeline = records.timeline("a")
    assert timeline is not None and len(timeline) == 2 and timeline[0]["overhead_ms"] == 4
    found = records.get("a")
    assert found is not None and found["tokens_sent"] == 50 and found["tokens_forwarded"] == 25
    assert records.overhead_quantiles() == {"p50": 2.0, "p99": 4.0}
    assert records.timeline("nobody") is None
