"""Session identity rules and the fingerprint of a conversation's opening."""

from __future__ import annotations

from typing import Any

import pytest

from compaction import is_valid_session_id
from proxy.compacting.decision.request import fingerprint as fingerprint_of
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.errors import SessionIdRefused
from proxy.sessions import resolve_session_id


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
