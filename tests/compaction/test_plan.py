"""Planning: trigger arithmetic, which rounds are kept, cuts inside a huge round, block alignment."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.corpus import read_corpus
from compaction import is_summary_message
from compaction.invariants import check_compacted
from compaction.plan import (
    Trigger,
    _kept_tokens,
    _pinned_tokens,
    _pins,
    _tokens,
    plan_compaction,
    preview_slack,
    room_for_prompt,
    target_tokens,
)
from compaction.segment import split
from compaction.tokens import HeuristicEstimator, estimate_request
from compaction.types import Plan, Segments
from tests import factories as f

EST = HeuristicEstimator()


def plan_for(messages: list[Any], window: int, **kwargs: Any) -> tuple[Segments, Plan]:
    segments = split(messages, EST)
    return segments, plan_compaction(segments, window=window, **kwargs)


def block_bounds(segments: Segments) -> set[int]:
    return (
        {b.start for r in segments.rounds for b in r.blocks}
        | {r.end for r in segments.rounds}
        | {segments.head_end}
    )


def assert_block_aligned(segments: Segments, plan: Plan) -> None:
    bounds = block_bounds(segments)
    assert plan.head_end == segments.head_end
    assert plan.keep_from in bounds
    for pin in plan.pinned:
        assert pin in bounds and pin + 1 in bounds and plan.head_end <= pin < plan.keep_from


def output_tokens(messages: list[Any], plan: Plan) -> int:
    """The compacted request's estimate, with the summary at its full budget."""
    kept = f.apply_plan(messages, plan)
    if kept is messages or plan.keep_from == plan.head_end:
        return estimate_request(messages, None, EST)
    without_summary = [m for i, m in enumerate(kept) if i != plan.head_end]
    return estimate_request(without_summary, None, EST) + plan.summary_budget_tokens


# ---------------------------------------------------------------- trigger


def test_should_compact_at_the_trigger_ratio() -> None:
    assert Trigger().is_reached(85_000, 100_000)
    assert not Trigger().is_reached(84_999, 100_000)
    assert Trigger(0.5).is_reached(50, 100)


def test_should_compact_when_the_requested_output_no_longer_fits() -> None:
    # With the estimate's margin (1% of the window) kept free: 69k + 30k + 1k.
    assert Trigger().is_reached(69_001, 100_000, max_output_tokens=30_000)
    assert not Trigger().is_reached(69_000, 100_000, max_output_tokens=30_000)
    assert room_for_prompt(100_000, 30_000) == 69_000


def test_an_absolute_trigger_fires_first_when_it_comes_before_the_ratio() -> None:
    trigger = Trigger(0.85, 200_000)
    assert trigger.at(1_000_000) == 200_000
    assert trigger.is_reached(200_000, 1_000_000)
    assert not trigger.is_reached(199_999, 1_000_000)
    # The ratio's trigger comes first on a small window, and so does a max_tokens that no
    # longer fits.
    assert trigger.at(128_000) == 108_800
    assert trigger.at(1_000_000, max_output_tokens=900_000) == 90_001
    assert Trigger(0.85, None).at(1_000_000) == 850_000


def test_an_absolute_trigger_moves_the_target_and_the_previews_bar_with_it() -> None:
    # 200k on a 1M window: the ratios are shares of the window whose 0.85 is 200k (235,294).
    trigger = Trigger(0.85, 200_000)
    assert trigger.effective_window(1_000_000) == 235_294
    assert trigger.effective_window(128_000) == 128_000  # the ratio comes first: no change
    assert target_tokens(1_000_000, 0.45, None, trigger) == 105_882
    assert target_tokens(1_000_000, 0.45, None) == 450_000  # above that trigger: a loop
    # Halfway from the target to the trigger, as at the ratio's trigger on that window.
    assert preview_slack(1_000_000, 0.45, trigger, None) == 47_059
    assert preview_slack(235_294, 0.45, Trigger(0.85), None) == 47_059


def test_target_comes_down_with_a_trigger_the_requested_output_brings_closer() -> None:
    assert target_tokens(100_000, 0.6, None) == 60_000
    assert target_tokens(100_000, 0.6, 10_000) == 60_000  # the trigger stays at 85k
    # Trigger at 49k (50k of output, 1k of margin): the target 0.6/0.85 of it, not just below.
    assert target_tokens(100_000, 0.6, 50_000) == 34_588
    assert target_tokens(100, 0.6, 500) == 0
    # Claude Code on a 200k window asks 128k: trigger at 70k, target 29k (not 70k, which left
    # a compaction on nearly every request).
    assert Trigger().at(200_000, 128_000) == 70_001
    assert target_tokens(200_000, 0.35, 128_000, Trigger()) == 28_823


def test_previews_alone_must_reach_halfway_from_the_target_to_the_trigger() -> None:
    # 45k + 20k: 0.65 of the window.
    assert preview_slack(100_000, 0.45, Trigger(0.85), None) == 20_000
    # A large max_tokens brings the trigger closer (67k) and the target with it (35.5k): the
    # halfway point keeps its share of the room between them.
    assert preview_slack(100_000, 0.45, Trigger(0.85), 32_000) == 15_766
    assert preview_slack(100_000, 0.45, Trigger(0.85), 60_000) == 9_177  # trigger 39k
    assert preview_slack(100_000, 0.9, Trigger(0.85), None) == 0
    assert preview_slack(8_000, 0.45, Trigger(0.85), None) == 1_600


# ---------------------------------------------------------------- kept rounds


def test_twenty_rounds_under_target_keep_exactly_the_last_five_and_pin_the_task() -> None:
    messages = f.simple_conversation(20, system_prompt=None)
    _, plan = plan_for(messages, 128_000, keep_recent_rounds=5)
    assert plan.keep_from == len(messages) - 10
    assert len(f.apply_plan(messages, plan)) == 12
    assert plan.fits and plan.pinned == (0,)


def test_few_rounds_under_target_come_back_unchanged() -> None:
    messages = f.simple_conversation(4)
    _, plan = plan_for(messages, 128_000, keep_recent_rounds=5)
    assert plan.keep_from == plan.head_end and plan.folded == ()
    assert plan.fits


def test_fewer_rounds_are_kept_when_they_do_not_fit() -> None:
    messages = f.simple_conversation(10, words=400)
    segments, plan = plan_for(messages, 8_000, summary_budget_tokens=500)
    kept_rounds = [r for r in segments.rounds if r.start >= plan.keep_from]
    assert 1 <= len(kept_rounds) < 5
    assert plan.fits and output_tokens(messages, plan) <= plan.target_tokens


def test_head_is_never_folded() -> None:
    messages = [f.system(), f.developer(), *f.simple_conversation(12, system_prompt=None)]
    _, plan = plan_for(messages, 100_000)
    assert plan.head_end == 2 and min((*plan.folded, *plan.pinned)) == 2


def test_an_earlier_summary_in_the_folded_span_is_folded() -> None:
    messages = [f.system(), f.summary(), *f.simple_conversation(8, system_prompt=None)]
    _, plan = plan_for(messages, 100_000)
    assert is_summary_message(messages[1]) and 1 in plan.folded


def test_an_earlier_summary_with_few_rounds_under_target_is_left_alone() -> None:
    messages = [f.system(), f.summary(), *f.simple_conversation(3, system_prompt=None)]
    _, plan = plan_for(messages, 100_000)
    assert plan.folded == ()


def test_max_output_tokens_tightens_the_target() -> None:
    messages = f.simple_conversation(20, words=100)
    _, loose = plan_for(messages, 10_000)
    _, tight = plan_for(messages, 10_000, max_output_tokens=8_000)
    # The trigger at 1,900 (10k - 8k of output - 100 of margin), the target 0.35/0.85 of it.
    assert tight.target_tokens == 782 < loose.target_tokens
    assert tight.keep_from >= loose.keep_from


# ---------------------------------------------------------------- one huge round


def test_a_huge_single_round_is_cut_inside_with_its_user_message_pinned() -> None:
    messages = f.single_task_conversation(300)
    segments, plan = plan_for(messages, 20_000)
    assert plan.pinned == (1,)
    assert plan.keep_from > 2 and plan.fits
    assert_block_aligned(segments, plan)
    assert output_tokens(messages, plan) <= plan.target_tokens
    assert plan.folded == tuple(range(2, plan.keep_from))


def test_a_single_giant_block_is_kept_whole_and_reported() -> None:
    messages = [
        f.system(),
        *f.simple_round(0),
        f.user("go"),
        *f.tool_block(2, output="x" * 200_000),
    ]
    segments, plan = plan_for(messages, 8_000)
    assert not plan.fits and plan.note
    assert plan.keep_from == 4 and plan.pinned == (1, 3)  # the task and the round's request
    assert_block_aligned(segments, plan)


def test_nothing_to_fold_when_the_history_is_the_head() -> None:
    messages = [f.system("s" * 100_000)]
    _, plan = plan_for(messages, 4_000)
    assert plan.keep_from == plan.head_end == 1 and not plan.fits and plan.note


def test_a_lone_giant_user_message_after_the_head_is_not_folded() -> None:
    messages = [f.system(), f.user("u" * 100_000)]
    _, plan = plan_for(messages, 4_000)
    assert plan.keep_from == plan.head_end and plan.pinned == () and not plan.fits


def test_folded_skips_pinned_messages() -> None:
    plan = Plan(
        head_end=1,
        keep_from=9,
        pinned=(4,),
        tokens_before=0,
        target_tokens=0,
        summary_budget_tokens=0,
        fits=True,
    )
    assert plan.folded == (1, 2, 3, 5, 6, 7, 8)


@given(
    st.integers(0, 30),
    st.integers(0, 30),
    st.lists(st.integers(0, 40), max_size=6),
)
def test_folded_is_every_index_between_head_and_tail_but_the_pinned(
    head_end: int, span: int, pinned: list[int]
) -> None:
    # Built from ranges (a long history folds hundreds of thousands): the same indices as the
    # definition, whatever the pins (repeated, unsorted, outside the span).
    plan = Plan(head_end, head_end + span, tuple(pinned), 0, 0, 0, True)
    expected = tuple(i for i in range(head_end, head_end + span) if i not in pinned)
    assert plan.folded == expected
    assert plan.folded is plan.folded  # computed once


# ---------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(
    f.conversations(malformed=True),
    st.integers(300, 40_000),
    st.integers(0, 6),
    st.sampled_from([None, 100, 2_000]),
)
def test_plans_are_block_aligned_deterministic_and_under_target(
    messages: list[Any], window: int, keep: int, max_output: int | None
) -> None:
    segments = split(messages, EST)
    kwargs: dict[str, Any] = dict(
        window=window,
        keep_recent_rounds=keep,
        summary_budget_tokens=200,
        max_output_tokens=max_output,
    )
    plan = plan_compaction(segments, **kwargs)
    assert plan == plan_compaction(split(messages, EST), **kwargs)
    assert_block_aligned(segments, plan)
    if plan.fits:
        assert output_tokens(messages, plan) <= plan.target_tokens
    else:
        assert plan.note
    assert check_compacted(messages, f.apply_plan(messages, plan), plan) == []


@settings(max_examples=60, deadline=None)
@given(f.conversations(max_rounds=4, max_blocks=12), st.integers(500, 6_000))
def test_the_latest_user_message_is_kept_pinned_or_quoted(messages: list[Any], window: int) -> None:
    segments, plan = plan_for(messages, window, summary_budget_tokens=100)
    users = [r.start for r in segments.rounds if r.has_user]
    if users and plan.folded:
        last = users[-1]
        assert last >= plan.keep_from or last in plan.pinned or last in plan.quoted


# ---------------------------------------------------------------- the corpus


@pytest.fixture(scope="module")
def corpus(corpus_dir: Path) -> list[tuple[str, list[Any], Any]]:
    return [
        (conv["id"], conv["messages"], conv.get("tools"))
        for path in sorted(corpus_dir.glob("*.jsonl"))
        for conv in read_corpus(path)
    ]


@pytest.mark.parametrize("window", [4_000, 16_000])
def test_every_corpus_conversation_gets_a_block_aligned_valid_plan(
    corpus: list[tuple[str, list[Any], Any]], window: int
) -> None:
    assert len(corpus) >= 400
    for conv_id, messages, tools in corpus:
        segments = split(messages, EST, tools)
        plan = plan_compaction(segments, window=window, summary_budget_tokens=window // 10)
        assert_block_aligned(segments, plan)
        problems = check_compacted(messages, f.apply_plan(messages, plan), plan)
        assert problems == [], conv_id
        if segments.total_tokens > window and not plan.fits:
            assert plan.note, conv_id


def test_over_the_target_more_than_keep_recent_rounds_are_kept_up_to_it() -> None:
    messages = f.simple_conversation(60, words=60)
    segments, plan = plan_for(
        messages, 8_000, keep_recent_rounds=2, summary_budget_tokens=500, target_ratio=0.6
    )
    kept_rounds = [r for r in segments.rounds if r.start >= plan.keep_from]
    assert len(kept_rounds) > 2 and plan.fits
    assert output_tokens(messages, plan) > 0.5 * 8_000  # near the 0.6 target, not far below


def test_strict_alternation_pins_nothing_and_keeps_from_an_assistant_turn() -> None:
    messages = f.simple_conversation(30, words=60)
    segments, plan = plan_for(messages, 4_000, strict_alternation=True)
    assert plan.folded and plan.pinned == ()
    assert messages[plan.keep_from]["role"] == "assistant"
    assert segments.task in plan.quoted  # the task goes into the summary instead


def test_strict_alternation_holds_when_the_latest_block_alone_exceeds_the_target() -> None:
    messages = [f.system(), f.user("Please fix the parser bug."), f.assistant("ok " * 50)]
    for i in range(6):
        messages += [f.user(f"step {i} " + "w " * 40), f.assistant("done " * 40)]
    messages.append(f.user("Here is the log:\n" + "line of log text here\n" * 1500))
    _, plan = plan_for(messages, 8_000, strict_alternation=True)
    assert not plan.fits and plan.note
    assert plan.pinned == ()  # a pinned request after the summary would be two user turns
    assert messages[plan.keep_from]["role"] == "assistant"
    assert 1 in plan.quoted  # the task goes into the summary instead


def test_a_plan_sent_to_a_worker_leaves_its_folded_indices_behind() -> None:
    # The proxy reads `folded` on the loop (the checkpoint key) and then pickles the plan into
    # the worker's FinishJob: the cached tuple (an int per folded message, hundreds of
    # thousands in a long history) must not travel, pickled on the loop and unpickled there.
    plan = Plan(3, 200_003, (10,), 0, 0, 0, True)
    size = len(pickle.dumps(plan))
    assert len(plan.folded) == 199_999
    after = len(pickle.dumps(plan))
    assert after == size
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan and copy.folded == plan.folded


@given(f.conversations(malformed=True), st.integers(500, 20_000))
def test_the_sums_fill_asks_for_at_every_block_are_their_definitions(
    messages: list[Any], window: int
) -> None:
    """`_fill` sums the pins and the kept blocks without building the pins' tuples or walking
    the folded blocks: the same numbers as from `_pins` and from every block."""
    segments = split(messages, EST)
    blocks = [b for r in segments.rounds for b in r.blocks]
    for block in blocks:
        pinned, _ = _pins(segments, block.start, window, pin=True)
        assert _pinned_tokens(segments, block.start, window) == _tokens(segments, pinned)
        kept = sum(b.tokens for b in blocks if b.start >= block.start)
        assert _kept_tokens(segments, block.start) == kept
