"""The selective pass (compaction.selective) and the strategies: old tool outputs become previews
chosen by priority, everything else stays the caller's own object, hybrid summarizes only when
previews are not enough, selective never calls the model, and the result is remembered by a
checkpoint that reproduces it byte for byte."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    CheckpointCache,
    CompactionSettings,
    Compactor,
    View,
    checkpoint_after,
    plan_key,
    prefix_digests,
)
from compaction.checkpoints import Checkpoint, find_longest
from compaction.invariants import check_tool_pairing
from compaction.marker import PREVIEW_MARK
from compaction.offload import JobMessages
from compaction.plan import plan_compaction
from compaction.segment import split
from compaction.selective import RECENT_TOOL_BLOCKS, preview_text
from compaction.stages import PlanJob, make_plan
from compaction.tokens import HeuristicEstimator
from tests import factories as f
from tests.compaction.conftest import ScriptedLLM

WINDOW = 32_000
LISTING = "".join(f"src/package/module_{i}.py\n" for i in range(400))  # ~10k characters
FAILURE = (
    "Traceback (most recent call last):\n"
    + '  File "src/app.py", line 3, in <module>\n' * 150
    + "ValueError: the quasar drive QX-7781 is out of range\n"
)


def compactor(strategy: str = "hybrid") -> Compactor:
    # The histories here are sized for previews to reach a 0.6 target: the tests below that
    # check reaching the target, the choice of outputs and the checkpoints need them to.
    settings = CompactionSettings(strategy=strategy, target_ratio=0.6)  # type: ignore[arg-type]
    return Compactor(settings=settings)


def listing_conversation(blocks: int = 12, output: str = LISTING) -> list[dict[str, Any]]:
    """One task, then `blocks` tool blocks with long outputs, then a follow-up request."""
    messages = [f.system(), f.user("Find where the drive is configured.")]
    for _ in range(blocks):
        messages += f.tool_block(output=output)
    messages.append(f.user("Now fix it."))
    return messages


def tool_indices(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "tool"]


async def test_old_tool_outputs_become_previews_and_nothing_else_changes() -> None:
    messages = listing_conversation()
    llm = ScriptedLLM()
    compaction = await compactor().prepare(messages, window=WINDOW)
    result = await compaction.run(llm=llm, session_id=None)

    assert result.path == "selective" and result.strategy == "selective"
    assert llm.calls == [] and result.model_calls == 0
    assert result.tokens_after <= compaction.plan.target_tokens < result.tokens_before
    previewed = {i for i, _ in result.previews}
    recent = tool_indices(messages)[-RECENT_TOOL_BLOCKS:]
    assert previewed and not previewed & set(recent)
    for i, (before, after) in enumerate(zip(messages, result.messages, strict=True)):
        if i in previewed:
            assert after is not before and after["tool_call_id"] == before["tool_call_id"]
            assert PREVIEW_MARK in after["content"] and len(after["content"]) < 1000
            assert after["content"].startswith(LISTING[:100])
        else:
            assert after is before  # head, user turns, calls, recent loop: the same objects
    assert check_tool_pairing(result.messages) == []
    assert result.keep_from == result.prefix_len == max(previewed) + 1


async def test_errors_are_kept_longer_than_successful_listings() -> None:
    messages = listing_conversation(blocks=12)
    error_at = tool_indices(messages)[0]  # the oldest and the largest: first in line but for
    messages[error_at] = {**messages[error_at], "content": FAILURE}
    result = await (await compactor().prepare(messages, window=WINDOW)).run(
        llm=None, session_id=None
    )
    assert result.path == "selective"
    assert result.messages[error_at] is messages[error_at]


async def test_the_largest_outputs_are_reduced_first() -> None:
    messages = listing_conversation(blocks=12, output=LISTING[:3000])
    large_at = tool_indices(messages)[3]
    messages[large_at] = {**messages[large_at], "content": LISTING * 3}
    result = await (await compactor().prepare(messages, window=16_000)).run(
        llm=None, session_id=None
    )
    previewed = [i for i, _ in result.previews]
    assert large_at in previewed
    # Reaching the target took the large one and only as many of the others as needed.
    assert len(previewed) < len(tool_indices(messages)) - RECENT_TOOL_BLOCKS


def test_a_preview_keeps_the_head_the_tail_and_what_failed() -> None:
    text = preview_text(FAILURE)
    assert text.startswith("Traceback (most recent call last):")
    assert "ValueError: the quasar drive QX-7781 is out of range" in text
    assert f"{len(FAILURE)} characters" in text and "archived" in text and "`recall`" in text
    assert len(text) < len(FAILURE) // 5


async def test_hybrid_summarizes_when_previews_are_not_enough() -> None:
    messages = f.simple_conversation(60)  # prose only: nothing to preview
    llm = ScriptedLLM()
    result = await (await compactor("hybrid").prepare(messages, window=4000)).run(
        llm=llm, session_id=None
    )
    assert result.path == "llm" and result.strategy == "summary"
    assert result.model_calls == 2 and len(llm.calls) == 2


@pytest.mark.parametrize(("blocks", "enough"), [(8, True), (6, False)])
async def test_hybrid_takes_previews_that_reach_halfway_from_the_target_to_the_trigger(
    blocks: int, enough: bool
) -> None:
    # At the default ratios (target 0.35, trigger 0.85) previews alone are enough when they
    # bring the request to 0.60 of the window: eight blocks leave three long outputs to
    # reduce, six only one.
    messages = listing_conversation(blocks=blocks)
    estimator = HeuristicEstimator()
    window = int(sum(map(estimator.count_message, messages)) / 0.9)
    llm = ScriptedLLM()
    compaction = await Compactor(settings=CompactionSettings()).prepare(messages, window=window)
    result = await compaction.run(llm=llm, session_id=None)
    if enough:
        assert result.path == "selective" and llm.calls == []
        assert compaction.plan.target_tokens < result.tokens_after <= 0.65 * window
    else:
        assert result.path == "llm" and len(llm.calls) == result.model_calls > 0
        assert result.tokens_after <= compaction.plan.target_tokens


@pytest.mark.parametrize("options", [{"max_output_tokens": 0.3}, {"target_ratio": 0.3}])
async def test_the_bar_moves_with_the_trigger_and_with_a_target_prepared_ahead(
    options: dict[str, float],
) -> None:
    # Eight blocks leave the request at 0.59 of the window after every preview: enough against
    # the defaults' 0.60, not when max_tokens brings the trigger to 0.7 (halfway from 0.35:
    # 0.525), nor for a compaction prepared ahead at a target of 0.30 (halfway to the trigger:
    # 0.575).
    messages = listing_conversation(blocks=8)
    estimator = HeuristicEstimator()
    window = int(sum(map(estimator.count_message, messages)) / 0.9)
    compactor = Compactor(settings=CompactionSettings())
    assert (await compactor.prepare(messages, window=window)).plan.previews
    if "max_output_tokens" in options:
        planned = await compactor.prepare(
            messages, window=window, max_output_tokens=int(options["max_output_tokens"] * window)
        )
    else:
        planned = await compactor.prepare(
            messages, window=window, target_ratio=options["target_ratio"]
        )
    assert planned.plan.previews == () and planned.plan.summarize


async def test_selective_alone_never_calls_the_model() -> None:
    messages = f.simple_conversation(60)
    llm = ScriptedLLM()
    result = await (await compactor("selective").prepare(messages, window=4000)).run(
        llm=llm, session_id=None
    )
    assert result.path == "extractive" and llm.calls == [] and result.model_calls == 0
    assert result.tokens_after < result.tokens_before


def test_the_summary_strategy_plans_exactly_as_the_summary_planner() -> None:
    messages = listing_conversation()
    estimator = HeuristicEstimator()
    job = PlanJob(
        messages=JobMessages.of(messages, crossing=False),
        tools=None,
        estimator=estimator,
        shape=CHAT,
        window=WINDOW,
        target_ratio=0.6,
        keep_recent_rounds=5,
        summary_budget_tokens=1200,
        max_output_tokens=None,
        strict_alternation=False,
        strategy="summary",
    )
    planned = make_plan(job).plan
    assert planned.previews == () and planned.summarize
    assert planned == plan_compaction(
        split(messages, estimator),
        window=WINDOW,
        target_ratio=0.6,
        keep_recent_rounds=5,
        summary_budget_tokens=1200,
    )


def test_each_dialect_reduces_only_the_output_and_keeps_its_ids() -> None:
    reduce = str.upper
    chat = {"role": "tool", "tool_call_id": "c1", "content": "out", "x-extra": 1}
    assert CHAT.with_output(chat, reduce) == {**chat, "content": "OUT"}
    assert CHAT.with_output(f.assistant("hi"), reduce) is None
    assert CHAT.with_output(f.user("a request"), reduce) is None
    output = {"type": "function_call_output", "call_id": "c2", "output": "out"}
    assert RESPONSES.with_output(output, reduce) == {**output, "output": "OUT"}
    assert RESPONSES.with_output({"type": "function_call", "call_id": "c2"}, reduce) is None
    turn = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "out"},
            {"type": "text", "text": "and a word from the user"},
        ],
    }
    reduced = ANTHROPIC.with_output(turn, reduce)
    assert reduced is not None
    assert reduced["content"][0] == {**turn["content"][0], "content": "OUT"}
    assert reduced["content"][1] is turn["content"][1]
    assert turn["content"][0]["content"] == "out"  # the caller's message is never edited


def test_a_short_result_beside_a_long_one_is_left_whole() -> None:
    long = {"type": "tool_result", "tool_use_id": "t1", "content": LISTING}
    short = {
        "type": "tool_result",
        "tool_use_id": "t2",
        "content": [{"type": "text", "text": "ok"}],
    }
    turn = {"role": "user", "content": [long, short]}
    reduced = ANTHROPIC.with_output(turn, preview_text)
    assert reduced is not None and reduced["content"][1] is short
    assert PREVIEW_MARK in reduced["content"][0]["content"]
    assert preview_text("total 0") == "total 0"


async def test_a_selective_checkpoint_reproduces_the_previews_byte_for_byte() -> None:
    messages = listing_conversation()
    digests = prefix_digests(messages, b"seed")
    view = View.of(messages, None)
    compaction = await compactor().prepare(messages, window=WINDOW)
    result = await compaction.run(llm=None, session_id=None)
    checkpoint = checkpoint_after(view, result, digests)
    assert checkpoint is not None and checkpoint.summary_message is None
    assert checkpoint.key == plan_key(view, compaction.plan, digests)

    grown = [*messages, f.assistant("On it."), f.user("And add a test.")]
    store = CheckpointCache()
    store.put(Checkpoint.from_json(orjson.loads(orjson.dumps(checkpoint.to_json()))))
    found = find_longest(store, prefix_digests(grown, b"seed"))
    assert found == checkpoint
    again = View.of(grown, found).messages
    assert orjson.dumps(again[: len(messages)]) == orjson.dumps(result.messages)
    assert again[len(messages) :] == grown[len(messages) :]


async def test_a_summary_extends_a_selective_checkpoint_and_keeps_its_later_previews() -> None:
    messages = listing_conversation(blocks=20)
    digests = prefix_digests(messages, b"seed")
    selective = await (await compactor().prepare(messages, window=WINDOW)).run(
        llm=None, session_id=None
    )
    base = checkpoint_after(View.of(messages, None), selective, digests)
    assert base is not None
    view = View.of(messages, base)
    # A smaller window: the previews are no longer enough, a summary folds the oldest part.
    compaction = await compactor("summary").prepare(view.messages, window=WINDOW // 2)
    result = await compaction.run(llm=ScriptedLLM(), session_id=None)
    assert result.path == "llm"
    extended = checkpoint_after(view, result, digests)
    assert extended is not None and extended.key == plan_key(view, compaction.plan, digests)
    assert extended.summary_message is result.summary_message
    assert orjson.dumps(View.of(messages, extended).messages) == orjson.dumps(result.messages)


async def test_previews_extend_a_summary_checkpoint() -> None:
    first = [*f.agent_conversation(8, blocks=3, output_chars=300), f.user("Go on.")]
    digests = prefix_digests(first, b"seed")
    summary = await (await compactor("summary").prepare(first, window=1500)).run(
        llm=ScriptedLLM(), session_id=None
    )
    base = checkpoint_after(View.of(first, None), summary, digests)
    assert base is not None
    assert summary.path == "llm"
    grown = first[:-1]
    for _ in range(14):
        grown += f.tool_block(output=LISTING)
    grown.append(f.user("Now fix it."))
    digests = prefix_digests(grown, b"seed")
    view = View.of(grown, base)
    result = await (await compactor().prepare(view.messages, window=WINDOW)).run(
        llm=None, session_id=None
    )
    assert result.path == "selective"
    extended = checkpoint_after(view, result, digests)
    assert extended is not None and extended.summary_message is base.summary_message
    assert orjson.dumps(View.of(grown, extended).messages) == orjson.dumps(result.messages)


async def test_a_checkpoint_with_previews_round_trips_only_under_its_own_version() -> None:
    messages = listing_conversation()
    result = await (await compactor().prepare(messages, window=WINDOW)).run(
        llm=None, session_id=None
    )
    checkpoint = checkpoint_after(View.of(messages, None), result, prefix_digests(messages, b"s"))
    assert checkpoint is not None
    data = orjson.loads(orjson.dumps(checkpoint.to_json()))
    assert data["version"] == 2 and Checkpoint.from_json(data) == checkpoint
    for wrong in ({"version": 1}, {"previews": [[len(messages) + 5, {"role": "tool"}]]}):
        with pytest.raises(ValueError):
            Checkpoint.from_json({**data, **wrong})
