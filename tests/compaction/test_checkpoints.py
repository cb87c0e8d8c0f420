"""Checkpoints: prefix digests, longest-prefix lookup, and mapping a compaction back to the original."""

from __future__ import annotations

from typing import Any

import pytest

from compaction import DigestPrefix
from compaction.checkpoints import (
    Checkpoint,
    CheckpointCache,
    View,
    checkpoint_after,
    conversation_seed,
    find_longest,
    longest_of,
    prefix_digests,
)
from compaction.marker import SUMMARY_MARKER
from compaction.types import CompactionResult


def test_a_prefix_reads_as_the_slice_it_stands_for() -> None:
    digests = prefix_digests(_conversation(6), b"seed")
    absent = prefix_digests(_conversation(1), b"other")[0]
    for count in (-1, 0, 1, 5, len(digests), len(digests) + 3):
        prefix, expected = DigestPrefix(digests, count), digests[: max(0, count)]
        assert len(prefix) == len(expected)
        assert list(prefix) == expected
        assert list(reversed(prefix)) == expected[::-1]
        assert [prefix[i] for i in range(-len(expected), len(expected))] == expected * 2
        assert prefix[1:-1] == expected[1:-1]
        for value in [*digests, absent]:
            assert (value in prefix) == (value in expected)
        assert list(DigestPrefix(prefix, count - 1)) == expected[: max(0, count - 1)]
        for index in (len(expected), -len(expected) - 1):
            with pytest.raises(IndexError):
                prefix[index]
    assert DigestPrefix(digests, 4).index(digests[3]) == 3
    assert (
        DigestPrefix(digests, 4).index(digests[3], -1) == 3
    )  # negatives count from the prefix's end
    with pytest.raises(ValueError):
        DigestPrefix(digests, 8).index(digests[7], 0, -1)
    with pytest.raises(ValueError):
        DigestPrefix(digests, 4).index(digests[4])  # past the prefix


def _conversation(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(rounds):
        messages.append({"role": "user", "content": f"question {i}"})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    return messages


def _summary(text: str) -> dict[str, Any]:
    return {"role": "user", "content": f"{SUMMARY_MARKER}\n{text}"}


def _result(
    messages: list[Any], keep_from: int, prefix: list[Any], summary: dict[str, Any]
) -> CompactionResult:
    return CompactionResult(
        messages=[*prefix, *messages[keep_from:]],
        path="llm",
        reason="test",
        keep_from=keep_from,
        prefix_len=len(prefix),
        summary_text="s",
        summary_message=summary,
        memory_items=(),
        verification=None,
        tokens_before=100,
        tokens_after=50,
        fits=True,
        compaction_id="c1",
        duration_s=0.0,
    )


def test_prefix_digests_ignore_key_order_but_not_content() -> None:
    seed = conversation_seed("key", "session")
    a = prefix_digests([{"role": "user", "content": "hi"}], seed)
    b = prefix_digests([{"content": "hi", "role": "user"}], seed)
    c = prefix_digests([{"role": "user", "content": "hi!"}], seed)
    assert a == b
    assert a != c


def test_seed_separates_tenants() -> None:
    messages = _conversation(2)
    assert prefix_digests(messages, conversation_seed("key-a", "s")) != prefix_digests(
        messages, conversation_seed("key-b", "s")
    )
    # A part boundary is not ambiguous: ("ab", "c") and ("a", "bc") differ.
    assert conversation_seed("ab", "c") != conversation_seed("a", "bc")


def test_find_longest_prefers_the_longest_remembered_prefix() -> None:
    messages = _conversation(6)
    digests = prefix_digests(messages, b"seed")
    store = CheckpointCache()
    for cut in (3, 7):
        store.put(Checkpoint(digests[cut - 1], cut, 1, (), _summary(str(cut)), "c", "llm"))
    found = find_longest(store, digests)
    assert found is not None and found.cut == 7
    # Another conversation sharing only the first three messages finds the shorter one.
    other = [
        *messages[:3],
        {"role": "user", "content": "something else"},
        {"role": "user", "content": "x"},
    ]
    found = find_longest(store, prefix_digests(other, b"seed"))
    assert found is not None and found.cut == 3


def test_the_last_message_is_never_part_of_a_checkpoint_lookup() -> None:
    messages = _conversation(2)
    digests = prefix_digests(messages, b"seed")
    store = CheckpointCache()
    store.put(Checkpoint(digests[-1], len(messages), 1, (), _summary("all"), "c", "llm"))
    assert find_longest(store, digests) is None


def test_store_entries_expire_after_their_ttl() -> None:
    now = [0.0]
    store = CheckpointCache(max_entries=10, ttl_s=5, timer=lambda: now[0])
    checkpoint = Checkpoint(b"k", 1, 0, (), _summary("x"), "c", "llm")
    store.put(checkpoint)
    assert store.get(b"k") is checkpoint
    now[0] = 6.0
    assert store.get(b"k") is None


def test_apply_keeps_the_requests_own_head_and_tail_objects() -> None:
    messages = _conversation(4)
    summary = _summary("earlier")
    checkpoint = Checkpoint(b"k", 5, 1, (), summary, "c", "llm")
    view = checkpoint.apply(messages)
    assert view[0] is messages[0]
    assert view[1] is summary
    assert all(a is b for a, b in zip(view[2:], messages[5:], strict=True))


def test_checkpoint_after_a_fresh_compaction_records_the_original_cut() -> None:
    messages = _conversation(6)
    digests = prefix_digests(messages, b"seed")
    summary = _summary("first")
    result = _result(messages, 7, [messages[0], summary], summary)
    checkpoint = checkpoint_after(View.of(messages, None), result, digests)
    assert checkpoint is not None
    assert (checkpoint.cut, checkpoint.head_end, checkpoint.pinned) == (7, 1, ())
    assert checkpoint.key == digests[6]
    assert checkpoint.apply(messages) == result.messages


def test_checkpoint_after_an_extension_maps_view_indices_to_the_original() -> None:
    messages = _conversation(10)
    digests = prefix_digests(messages, b"seed")
    first = Checkpoint(digests[4], 5, 1, (), _summary("first"), "c1", "llm")
    view = View.of(messages, first)
    # The view is [system, summary, u2, a2, ..., u9, a9]; fold up to view index 8 (= original 11).
    updated = _summary("updated")
    result = _result(view.messages, 8, [view.messages[0], updated], updated)
    checkpoint = checkpoint_after(view, result, digests)
    assert checkpoint is not None
    assert checkpoint.cut == 11
    assert checkpoint.apply(messages) == result.messages


def test_checkpoint_after_maps_a_pinned_user_message() -> None:
    messages = _conversation(3)
    digests = prefix_digests(messages, b"seed")
    summary = _summary("inside the round")
    # Pin the user message at 5 and keep from 6 on.
    result = _result(messages, 6, [messages[0], summary, messages[5]], summary)
    checkpoint = checkpoint_after(View.of(messages, None), result, digests)
    assert checkpoint is not None
    assert checkpoint.pinned == (5,)
    assert checkpoint.apply(messages) == result.messages


def test_unchanged_results_and_copied_messages_are_not_recorded() -> None:
    messages = _conversation(3)
    digests = prefix_digests(messages, b"seed")
    summary = _summary("s")
    unchanged = _result(messages, 0, [], summary)
    unchanged = CompactionResult(
        **{**unchanged.__dict__, "path": "unchanged", "summary_message": None}
    )
    assert checkpoint_after(View.of(messages, None), unchanged, digests) is None
    copied = _result(messages, 6, [messages[0], summary, dict(messages[5])], summary)
    assert checkpoint_after(View.of(messages, None), copied, digests) is None


def test_the_tables_own_lookup_finds_what_a_key_by_key_search_finds() -> None:
    messages = _conversation(8)
    digests = prefix_digests(messages, b"seed")
    now = [0.0]
    store = CheckpointCache(max_entries=3, ttl_s=5, timer=lambda: now[0])
    for cut in (3, 7, 11):
        store.put(Checkpoint(digests[cut - 1], cut, 1, (), _summary(str(cut)), "c", "llm"))
    # Under a key of its prefix, but not for that cut: never the answer.
    store.put(Checkpoint(digests[12], 2, 1, (), _summary("wrong"), "c", "llm"))
    for prefix in (digests[:5], digests[:9], digests[:13], digests):
        expected = longest_of(store.get, prefix)
        assert store.longest(prefix) is expected
    assert store.longest(digests[:2]) is None
    now[0] = 6.0  # every entry expired
    assert store.longest(digests) is None
