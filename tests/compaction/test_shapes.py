"""The Responses and Anthropic message shapes: their neutral view, their blocks, and compactions
that the real APIs would accept (checked by bench.dialects' strict validators)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.dialects import check_anthropic, check_responses, to_anthropic, to_responses
from compaction import CompactionSettings, Compactor, HeuristicEstimator
from compaction.messages import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    Shape,
    check_turns,
    join_summary,
    read_items,
)
from compaction.segment import block_end
from compaction.summarize import summary_message
from tests import factories as f

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def chat_history(rounds: int = 8) -> list[dict[str, Any]]:
    return [
        f.system(),
        *(m for i in range(rounds) for m in f.tool_round(i, blocks=2, calls_per_block=2)),
        f.user("And now the last task."),
    ]


def test_responses_reasoning_and_parallel_calls_are_one_block_with_their_outputs() -> None:
    items = to_responses(chat_history(1), TOOLS)["input"]
    kinds = [item.get("type") for item in items]
    # user, reasoning, call, call, output, output, reasoning, call, call, output, output, ...
    start = kinds.index("reasoning")
    view = read_items(items, RESPONSES)
    assert view[start].lead and view[start + 1].joins
    assert block_end(view, start) == start + 5
    assert [v.kind for v in view[start + 1 : start + 5]] == ["assistant"] * 2 + ["tool"] * 2


def test_responses_summary_item_is_recognised_and_has_its_text() -> None:
    item = summary_message("Goals: ship it.", RESPONSES)
    assert item["type"] == "message" and item["role"] == "user"
    assert RESPONSES.is_summary(item) and "Goals: ship it." in RESPONSES.read(item).text
    assert not RESPONSES.is_summary({"role": "user", "content": "hello"})


def test_anthropic_tool_use_and_tool_result_pair_across_turns() -> None:
    turns = to_anthropic(chat_history(1), TOOLS)["messages"]
    view = read_items(turns, ANTHROPIC)
    assert [v.kind for v in view[:3]] == ["user", "assistant", "tool"]
    assert view[1].call_ids == view[2].answers and len(view[1].call_ids) == 2
    assert block_end(view, 1) == 3


def test_join_summary_puts_the_summary_into_the_next_user_turn_after_its_results() -> None:
    summary = summary_message("Earlier work.", ANTHROPIC)
    text_turn = {"role": "user", "content": "next task", "extra": 1}
    joined = join_summary([summary, text_turn, {"role": "assistant", "content": "ok"}])
    assert joined[0]["extra"] == 1 and joined[0]["content"][1] == {
        "type": "text",
        "text": "next task",
    }
    assert joined[0]["content"][0]["text"] == summary["content"]
    assert text_turn["content"] == "next task"  # the caller's message is not edited
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    joined = join_summary([summary, {"role": "user", "content": [result]}])
    assert joined[0]["content"][0] == result and joined[0]["content"][1]["type"] == "text"
    task, request = {"role": "user", "content": "the task"}, {"role": "user", "content": "go on"}
    joined = join_summary([summary, task, request, {"role": "assistant", "content": "ok"}])
    assert [b["text"] for b in joined[0]["content"]] == [summary["content"], "the task", "go on"]
    assert check_turns(joined) == []
    before = [summary, {"role": "assistant", "content": "hi"}]
    assert join_summary(before) == before and check_turns(before) == []
    assert check_turns([{"role": "assistant"}, {"role": "assistant"}]) != []


@pytest.mark.parametrize("single_task", [False, True], ids=["rounds", "one-long-round"])
@pytest.mark.parametrize("shape", [RESPONSES, ANTHROPIC], ids=["responses", "anthropic"])
async def test_a_compaction_gives_what_the_real_api_accepts(
    shape: Shape, single_task: bool
) -> None:
    convert = to_responses if shape is RESPONSES else to_anthropic
    history = f.single_task_conversation(60) if single_task else chat_history()
    body = convert(history, TOOLS)
    listed = body["input"] if shape is RESPONSES else body["messages"]
    estimator = HeuristicEstimator(shape=shape)
    compactor = Compactor(
        settings=CompactionSettings(keep_recent_rounds=2, summary_max_tokens=300), shape=shape
    )
    window = int(compactor.estimate(listed, None, estimator=estimator) / 1.2)
    compaction = await compactor.prepare(listed, window=window)
    result = await compaction.run(llm=None, session_id=None)
    assert result.path in ("extractive", "dropped"), result.reason
    kept = result.messages[1:]
    assert all(any(k is m for m in listed) for k in kept)  # the caller's own objects
    if shape is RESPONSES:
        assert check_responses({"input": result.messages}, {}) == []
    else:
        assert check_anthropic({"messages": join_summary(result.messages)}, {}) == []


def test_responses_model_turn_with_a_message_before_its_calls_is_one_block() -> None:
    history = [f.user("go"), *f.tool_block(2, thought="Let me look."), f.user("next")]
    items = to_responses(history, TOOLS)["input"]
    assert [item["type"] for item in items[1:5]] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert block_end(read_items(items, RESPONSES), 1) == 7  # reasoning .. both outputs


def _with_each_value_replaced(item: Any, by: Any) -> list[Any]:
    """Copies of `item`, each with one of its values (at any depth) replaced by `by`."""
    copies: list[Any] = []
    pairs = item.items() if isinstance(item, dict) else enumerate(item)
    for key, value in pairs:
        copy = dict(item) if isinstance(item, dict) else list(item)
        copy[key] = by
        copies.append(copy)
        if isinstance(value, dict | list):
            for inner in _with_each_value_replaced(value, by):
                copy = dict(item) if isinstance(item, dict) else list(item)
                copy[key] = inner
                copies.append(copy)
    return copies


@pytest.mark.parametrize(
    "shape", [CHAT, RESPONSES, ANTHROPIC], ids=["chat", "responses", "anthropic"]
)
def test_an_item_with_a_list_or_object_where_a_string_belongs_is_read_and_measured(
    shape: Shape,
) -> None:
    history = chat_history(2)
    if shape is RESPONSES:
        history = to_responses(history, TOOLS)["input"]
    elif shape is ANTHROPIC:
        history = to_anthropic(history, TOOLS)["messages"]
    history.append(f.content_parts() if shape is CHAT else history[-1])
    estimator = HeuristicEstimator(shape=shape)
    for item in history:
        for odd in (odd for by in ([], {}) for odd in _with_each_value_replaced(item, by)):
            shape.read(odd)
            estimator.count_messages([odd])
