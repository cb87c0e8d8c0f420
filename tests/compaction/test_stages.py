"""The compaction's stages: an offloaded run equals an inline one; the last-resort drop."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from compaction import Compactor
from compaction.invariants import check_tool_pairing
from compaction.stages import collector_paused, drop_folded
from tests.compaction.conftest import ScriptedLLM
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
