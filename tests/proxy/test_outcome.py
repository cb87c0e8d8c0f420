"""The one place the `x-compaction-*` headers are rendered (proxy.outcome): which are told, in
which order, and how each value reads."""

from __future__ import annotations

from multidict import CIMultiDict

from proxy.outcome import UNCHANGED, Outcome, RecallFigures, add_headers


def rendered(
    outcome: Outcome | None, recall: RecallFigures | None = None, overhead_ms: float | None = None
) -> list[tuple[str, str]]:
    headers: CIMultiDict[str] = CIMultiDict()
    add_headers(headers, outcome, recall, overhead_ms)
    return list(headers.items())


def test_a_compaction_tells_its_status_session_tokens_id_recall_and_overhead_in_order() -> None:
    outcome = Outcome("applied", "agent-1", 5235, 1745, "c0ffee")
    assert rendered(outcome, RecallFigures(1, 105, 2.5), 0.1234) == [
        ("x-compaction-status", "applied"),
        ("x-compaction-session", "agent-1"),
        ("x-compaction-tokens-before", "5235"),
        ("x-compaction-tokens-after", "1745"),
        ("x-compaction-id", "c0ffee"),
        ("x-compaction-recall-rounds", "1"),
        ("x-compaction-recall-tokens", "105"),
        ("x-compaction-recall-ms", "2.500"),
        ("x-compaction-proxy-overhead-ms", "0.123"),
    ]


def test_what_is_not_known_is_not_told() -> None:
    assert rendered(UNCHANGED) == [("x-compaction-status", "none")]
    assert rendered(Outcome("failed", "agent-1")) == [
        ("x-compaction-status", "failed"),
        ("x-compaction-session", "agent-1"),
    ]
    # A decision without a compaction (below the trigger) tells its tokens, not an empty id.
    assert ("x-compaction-id", "") not in rendered(Outcome("none", "s", 10, 10, ""))
    assert rendered(None, overhead_ms=1.0) == [("x-compaction-proxy-overhead-ms", "1.000")]
    assert rendered(None) == []


def test_a_header_the_upstream_sent_under_the_same_name_is_replaced() -> None:
    headers: CIMultiDict[str] = CIMultiDict({"X-Compaction-Status": "upstream's"})
    add_headers(headers, UNCHANGED)
    assert headers.getall("x-compaction-status") == ["none"]
