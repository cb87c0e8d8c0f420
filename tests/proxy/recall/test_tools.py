"""The recall tool placed in a compacted body: after the client's tools, its bytes fixed, the
client's bytes untouched (proxy.recall.tools)."""

from __future__ import annotations

import orjson
import pytest

from compaction import recall_note, summary_message
from proxy.dialects.chat import CHAT_COMPLETIONS
from proxy.recall.tools import equip, has_own_recall, tool_bytes

SUMMARY = orjson.dumps(summary_message("Goals: fix the build."))


def body_with(tools_member: bytes) -> bytes:
    return b'{"model": "m",  "messages": [' + SUMMARY + b"]" + tools_member + b' , "n": 1.50 }'


@pytest.mark.parametrize(
    ("member", "tools"),
    [
        (b', "tools": [ {"type": "function", "function": {"name": "bash"}} ]', 1),
        (b', "tools": [ ]', 0),
        (b', "tools": null', 0),
        (b"", 0),
    ],
    ids=["client-tools", "empty", "null", "absent"],
)
def test_the_tool_goes_after_the_clients_and_nothing_else_moves(member: bytes, tools: int) -> None:
    body = body_with(member)
    equipped = equip(body, orjson.loads(body), CHAT_COMPLETIONS)
    assert equipped is not None
    sent = orjson.loads(equipped)
    assert len(sent["tools"]) == tools + 1
    assert orjson.dumps(sent["tools"][-1]) == tool_bytes(CHAT_COMPLETIONS)
    assert sent["messages"][0]["content"].count(recall_note()[1]) == 1
    # The client's other bytes as they came (1.50 stays 1.50).
    assert equipped.startswith(b'{"model": "m",  "messages": [') and b'"n": 1.50' in equipped
    if tools:
        assert member.rstrip(b" ]") in equipped


def test_a_body_without_our_summary_is_not_equipped() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    assert equip(body, orjson.loads(body), CHAT_COMPLETIONS) is None


def test_a_clients_own_recall_tool_is_recognized_in_every_shape() -> None:
    assert has_own_recall({"tools": [{"type": "function", "function": {"name": "recall"}}]})
    assert has_own_recall({"tools": [{"type": "function", "name": "recall"}]})
    assert has_own_recall({"tools": [{"name": "recall", "input_schema": {}}]})
    assert not has_own_recall({"tools": [{"name": "bash"}]})
