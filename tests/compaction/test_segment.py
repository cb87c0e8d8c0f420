"""Segmentation: head, rounds, atomic tool blocks, malformed items kept in place."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hypothesis import given

from bench.corpus import read_corpus
from bench.dialects import to_anthropic, to_responses
from compaction.messages import ANTHROPIC, CHAT, RESPONSES, Item, Shape, read_items
from compaction.segment import block_end, split
from compaction.tokens import HeuristicEstimator, estimate_request
from compaction.types import Block, Segments
from tests import factories as f

EST = HeuristicEstimator()


def block_spans(segments: Segments) -> list[tuple[int, int]]:
    return [(b.start, b.end) for r in segments.rounds for b in r.blocks]


def assert_partition(segments: Segments, n: int) -> None:
    """Head, then rounds and their blocks, cover [0, n) in order without gaps."""
    position = segments.head_end
    for round_ in segments.rounds:
        assert round_.start == position
        assert round_.blocks[0].start == round_.start and round_.blocks[-1].end == round_.end
        for block in round_.blocks:
            assert block.start == position and block.end > block.start
            position = block.end
        assert round_.tokens == sum(b.tokens for b in round_.blocks)
    assert position == n


def test_head_is_the_leading_system_and_developer_messages() -> None:
    messages = [f.system(), f.developer(), f.user(), f.system("late system"), f.assistant()]
    segments = split(messages, EST)
    assert segments.head_end == 2
    assert [(r.start, r.end) for r in segments.rounds] == [(2, 5)]


def test_each_user_message_starts_a_round() -> None:
    segments = split(f.simple_conversation(4), EST)
    assert [(r.start, r.end, r.has_user) for r in segments.rounds] == [
        (1, 3, True),
        (3, 5, True),
        (5, 7, True),
        (7, 9, True),
    ]


def test_parallel_calls_and_their_results_are_one_block() -> None:
    messages = [f.user(), *f.tool_block(3), f.assistant()]
    segments = split(messages, EST)
    assert block_spans(segments) == [(0, 1), (1, 5), (5, 6)]
    assert [b.kind for b in segments.rounds[0].blocks] == ["message", "tool", "message"]


def test_an_earlier_summary_is_preamble_not_a_round() -> None:
    messages = [f.system(), f.summary(), f.assistant("hi"), *f.simple_round(0)]
    segments = split(messages, EST)
    preamble, first = segments.rounds
    assert (preamble.start, preamble.end, preamble.has_user) == (1, 3, False)
    assert first.has_user and first.start == 3


def test_no_preamble_round_when_a_user_message_follows_the_head() -> None:
    segments = split(f.simple_conversation(2), EST)
    assert all(r.has_user for r in segments.rounds)


def test_a_stray_tool_message_between_answers_stays_inside_the_block() -> None:
    call_a, call_b = f.tool_call("a"), f.tool_call("b")
    messages = [
        f.user(),
        f.assistant_calls(call_a, call_b),
        f.tool_result("a"),
        f.tool_result("stray"),
        f.tool_result("b"),
        f.tool_result("trailing stray"),
    ]
    assert block_spans(split(messages, EST)) == [(0, 1), (1, 5), (5, 6)]


def test_malformed_items_become_their_own_blocks_in_place() -> None:
    items = f.malformed_items()
    messages = [f.system(), f.user(), *items]
    segments = split(messages, EST)
    assert_partition(segments, len(messages))
    assert (
        len(segments.rounds[0].blocks) == 1 + len(items) - 1
    )  # the trailing list user starts a round
    assert all(b.kind == "message" for r in segments.rounds for b in r.blocks)


def test_empty_and_head_only_histories() -> None:
    assert split([], EST).rounds == ()
    head_only = split([f.system(), f.developer()], EST)
    assert head_only.head_end == 2 and head_only.rounds == ()


def test_totals_match_estimate_request() -> None:
    messages = f.agent_conversation(3, blocks=4, calls_per_block=2)
    tools = [{"type": "function", "function": {"name": "bash"}}]
    segments = split(messages, EST, tools)
    assert segments.total_tokens == estimate_request(messages, tools, EST)
    assert segments.tools_tokens == EST.count_tools(tools)
    assert segments.head_tokens == EST.count_message(messages[0])


@given(f.conversations(malformed=True))
def test_segments_partition_any_conversation(messages: list[Any]) -> None:
    segments = split(messages, EST)
    assert_partition(segments, len(messages))
    for round_ in segments.rounds:
        for block in round_.blocks:
            if block.kind == "tool":
                assert messages[block.start]["tool_calls"]
                assert all(m["role"] == "tool" for m in messages[block.start + 1 : block.end])


@given(f.conversations())
def test_every_well_formed_tool_block_is_found_whole(messages: list[Any]) -> None:
    segments = split(messages, EST)
    starts = {b.start: b for r in segments.rounds for b in r.blocks}
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            block = starts[i]
            assert block.kind == "tool" and block.end - block.start == 1 + len(m["tool_calls"])


def _reference_blocks(
    items: Sequence[Item], start: int, end: int, counts: Sequence[int]
) -> list[Block]:
    """The blocks of items[start:end] by their definition: `block_end` from every start."""
    blocks: list[Block] = []
    i = start
    while i < end:
        stop = min(block_end(items, i), end)
        acts = [(it.calls and it.call_ids) or it.observation for it in items[i:stop]]
        kind: Literal["tool", "message"] = "tool" if stop > i + 1 and any(acts) else "message"
        tokens = sum(counts[i:stop])
        blocks.append(Block(i, stop, kind, tokens, items[i].kind in ("user", "summary")))
        i = stop
    return blocks


def _assert_blocks_by_definition(messages: list[Any], shape: Shape = CHAT) -> None:
    segments = split(messages, EST, shape=shape)
    items = read_items(messages, shape)
    counts = [EST.count_message(m) for m in messages]
    for round_ in segments.rounds:
        expected = _reference_blocks(items, round_.start, round_.end, counts)
        assert list(round_.blocks) == expected
        assert round_.tokens == sum(counts[round_.start : round_.end])


@given(f.conversations(malformed=True))
def test_blocks_are_the_block_end_definition(messages: list[Any]) -> None:
    _assert_blocks_by_definition(messages)


def test_blocks_are_the_block_end_definition_on_the_corpus(corpus_dir: Path) -> None:
    """Every trajectory (text actions and their observations, tool calls, prose) in each
    shape: the walk that skips `block_end` for items that neither lead nor call finds the
    same blocks."""
    checked = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in itertools.islice(read_corpus(path), 20):
            messages, tools = conversation["messages"], conversation.get("tools")
            _assert_blocks_by_definition(messages)
            _assert_blocks_by_definition(to_responses(messages, tools)["input"], RESPONSES)
            anthropic = to_anthropic(messages, tools)["messages"]
            _assert_blocks_by_definition(anthropic, ANTHROPIC)
            checked += 1
    assert checked >= 50


@given(f.conversations(malformed=True))
def test_round_of_and_block_at_find_what_holds_or_starts_at_an_index(messages: list[Any]) -> None:
    segments = split(messages, EST)
    holding = {i: r for r in segments.rounds for i in range(r.start, r.end)}
    starting = {b.start: b for r in segments.rounds for b in r.blocks}
    for i in range(-1, len(messages) + 2):
        assert segments.round_of(i) == holding.get(i)
        assert segments.block_at(i) == starting.get(i)
