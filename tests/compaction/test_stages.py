"""The compaction's stages: an offloaded run equals an inline one; the last-resort drop."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from compaction import CompactionSettings, Compactor
from compaction.invariants import check_tool_pairing
from compaction.stages import collector_paused, drop_folded
from tests.compaction.conftest import ScriptedLLM, text_of
from tests.factories import agent_conversation

J = TypeVar("J")
R = TypeVar("R")


class PicklingOffload:
    """Runs each job on a pickled copy of it, as another process would, and counts the jobs."""

    crossing = True

    def __init__(self) -> None:
        self.jobs: list[str] = []

    async def run(self, fn: Callable[[J], R], job: J) -> R:
        self.jobs.append(fn.__name__)
        result = fn(pickle.loads(pickle.dumps(job)))
        return pickle.loads(pickle.dumps(result))  # type: ignore[no-any-return]


async def test_an_offloaded_run_gives_what_an_inline_run_gives(llm: ScriptedLLM) -> None:
    messages = agent_conversation(rounds=30)
    inline = Compactor()
    offload = PicklingOffload()
    elsewhere = Compactor(offload=offload)
    compaction = await inline.prepare(messages, window=4000)
    plan = compaction.plan
    sent = await elsewhere.prepare(messages, window=4000)
    assert sent.plan == plan
    here = await compaction.run(llm=llm, session_id=None)
    there = await sent.run(llm=llm, session_id=None)
    assert offload.jobs == ["make_plan", "fold", "finish"]
    assert there.path == here.path == "llm"
    assert there.summary_message == here.summary_message
    kept = there.messages[there.prefix_len :]
    assert all(a is b for a, b in zip(kept, messages[plan.keep_from :], strict=True))


def test_the_last_resort_drops_the_folded_part_with_a_note() -> None:
    messages: list[Any] = agent_conversation(rounds=30)
    compactor = Compactor()
    plan = compactor.plan(messages, window=4000)
    result = drop_folded(
        messages,
        plan,
        shape=compactor.shape,
        tools=None,
        estimator=compactor.estimator,
        compaction_id="c1",
    )
    assert result.path == "dropped"
    assert result.messages[plan.head_end]["content"].count("omitted") == 1
    assert result.messages[result.prefix_len :] == messages[plan.keep_from :]
    assert result.tokens_after < plan.tokens_before
    assert check_tool_pairing(result.messages) == []


def _rule_round(number: int) -> list[Any]:
    rule = f"Never touch the table orders_{number} without a migration note."
    return [
        {"role": "user", "content": rule},
        {"role": "assistant", "content": f"Noted rule {number}. " + "y " * 300},
    ]


async def test_the_last_resort_after_a_compaction_keeps_every_standing_instruction() -> None:
    compactor = Compactor(settings=CompactionSettings(pinned_ratio=0.10))
    messages: list[Any] = [{"role": "system", "content": "You are a database assistant."}]
    for number in range(6):
        messages += _rule_round(number)
    messages += agent_conversation(rounds=8)[1:]
    first = await (await compactor.prepare(messages, window=6000)).run(llm=None, session_id=None)
    assert first.path == "extractive"
    # The chat goes on: more rules, more work; the next compaction has no time for a summary.
    grown = list(first.messages)
    for number in range(6, 9):
        grown += _rule_round(number)
    grown += agent_conversation(rounds=8)[1:]
    second = (await compactor.prepare(grown, window=6000)).dropped()
    assert second.path == "dropped"
    assert first.summary_message in [grown[i] for i in second_folded(compactor, grown)]
    assert second.messages[1]["content"].count("omitted") == 1
    forwarded = text_of(second.messages)
    rules = [f"Never touch the table orders_{n} without a migration note." for n in range(9)]
    memory = {item.content for item in second.memory_items}
    assert [rule for rule in rules if rule not in forwarded and rule not in memory] == []
    assert second.pinned_overflow == len(memory)


async def test_the_last_resort_counts_the_standing_instructions_it_has_no_room_for() -> None:
    compactor = Compactor(settings=CompactionSettings(pinned_ratio=0.02))
    messages: list[Any] = [{"role": "system", "content": "You are a database assistant."}]
    for number in range(12):
        messages += _rule_round(number)
    messages += agent_conversation(rounds=8)[1:]
    result = (await compactor.prepare(messages, window=6000)).dropped()
    assert result.path == "dropped"
    summary = result.messages[1]["content"]
    as_messages = {m["content"] for m in result.messages}  # the task stays a message of its own
    rules = [f"Never touch the table orders_{n} without a migration note." for n in range(12)]
    left_out = [rule for rule in rules if rule not in summary and rule not in as_messages]
    assert left_out and result.pinned_overflow == len(left_out)
    assert f"- ({len(left_out)} more had no room here" in summary
    assert {item.content for item in result.memory_items} == set(left_out)


def second_folded(compactor: Compactor, messages: list[Any]) -> tuple[int, ...]:
    return compactor.plan(messages, window=6000).folded


def test_the_collector_is_paused_during_a_stage_and_restored_after() -> None:
    seen: list[bool] = []
    with collector_paused():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
