"""Memory items: robust parsing of the model's answer and keyword extraction."""

from __future__ import annotations

import json

from compaction import MemoryItem, read_items
from compaction.extract import (
    extract_items_heuristically,
    extract_memory_items,
    parse_memory_reply,
)
from tests.factories import assistant, tool_result, user

# ---------------------------------------------------------------- parsing


def test_parse_plain_array() -> None:
    text = '[{"type": "decision", "content": "Use Postgres"}, {"type": "todo", "content": "Add index"}]'
    assert parse_memory_reply(text) == [
        MemoryItem("decision", "Use Postgres"),
        MemoryItem("todo", "Add index"),
    ]


def test_parse_array_in_code_fence_with_prose_around() -> None:
    text = 'Here you go:\n```json\n[{"type": "fact", "content": "Port is 8080"}]\n```\nHope it helps [1].'
    assert parse_memory_reply(text) == [MemoryItem("fact", "Port is 8080")]


def test_bad_and_unknown_items_are_dropped() -> None:
    text = json.dumps(
        [
            {"type": "preference", "content": "  Short   answers "},
            {"type": "opinion", "content": "unknown type"},
            {"type": "fact"},
            {"type": "fact", "content": 42},
            {"type": "fact", "content": "   "},
            "a string",
            {"type": "TODO", "content": "Write docs"},
            {"type": "preference", "content": "Short answers"},
        ]
    )
    assert parse_memory_reply(text) == [
        MemoryItem("preference", "Short answers"),
        MemoryItem("todo", "Write docs"),
    ]


def test_no_array_is_none_and_empty_array_is_empty() -> None:
    assert parse_memory_reply("Sorry, nothing [here") is None
    assert parse_memory_reply("no array at all") is None
    assert parse_memory_reply("[]") == []
    found = [MemoryItem("fact", "x y")]
    assert parse_memory_reply('[not json] then [{"type": "fact", "content": "x y"}]') == found
    assert parse_memory_reply('As noted [1], here: [{"type": "fact", "content": "x y"}]') == found


def test_heuristic_extraction_is_precise() -> None:
    messages = [
        user("I prefer tabs over spaces. What time is it?"),
        assistant("We decided to use SQLite for the tests. The sky is blue."),
        assistant("Next step: wire the cache. TODO: add an index on users.email."),
        tool_result("call_x", "we will never see tool output as a preference"),
        assistant("Never mind, all good here."),  # not from the user: no preference
        assistant("THOUGHT: I need to look at the parser first."),  # thinking aloud: no todo
        user("I always loved painting. Next step: book the venue."),  # small talk: no preference
    ]
    assert extract_items_heuristically(read_items(messages)) == [
        MemoryItem("preference", "I prefer tabs over spaces."),
        MemoryItem("decision", "We decided to use SQLite for the tests."),
        MemoryItem("todo", "TODO: add an index on users.email."),
        MemoryItem("todo", "Next step: book the venue."),
    ]


def test_a_reply_without_a_valid_item_falls_back_to_extraction() -> None:
    folded = read_items([user("We decided to use Redis for caching.")])
    expected = [MemoryItem("decision", "We decided to use Redis for caching.")]
    for reply in ("[]", '{"items": []}', '[{"kind": "fact", "text": "x"}]', '[{"type": "fact"}]'):
        items, _ = extract_memory_items(reply, folded)
        assert items == expected, reply
    items, error = extract_memory_items('[{"type": "fact", "content": "Port 8080"}]', folded)
    assert items == [MemoryItem("fact", "Port 8080")] and error is None


def test_heuristic_extraction_reads_chinese() -> None:
    items = extract_items_heuristically(
        read_items([user("我们决定使用 React 而不是 Vue。请用简短的回答，不要用表情。")])
    )
    assert [i.type for i in items] == ["decision", "preference"]
