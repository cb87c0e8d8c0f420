"""A summary over many compactions: one summary, never nested; the ledger and the task carried
forward through fallbacks and through updates by a forgetful model."""

from __future__ import annotations

from typing import Any

from compaction import CompactionSettings, Compactor, is_summary_message
from compaction.invariants import check_compacted
from compaction.segment import split
from tests.compaction.conftest import ScriptedLLM
from tests.factories import agent_conversation, assistant, system, user

SETTINGS = CompactionSettings(llm_timeout_s=1)
LOSSY = "The agent worked on the task and made progress."


async def _grow_and_compact(
    llm: Any, steps: int = 24, window: int = 3_000, memory: list[str] | None = None
) -> list[Any]:
    """Compact a growing agent conversation again and again, like the proxy's extensions; the
    memory items written along the way go to `memory`."""
    compactor = Compactor(settings=SETTINGS)
    base = agent_conversation(40, blocks=2, output_chars=600)
    sent: list[Any] = base[:12]
    summaries: list[str] = []
    for step in range(steps):
        sent = [*sent, *base[12 + step * 6 : 18 + step * 6]]
        if compactor.needs_compaction(compactor.estimate(sent), window):
            compaction = await compactor.prepare(sent, window=window)
            plan = compaction.plan
            result = await compaction.run(llm=llm, session_id=None)
            assert check_compacted(sent, result.messages, plan) == []
            sent = result.messages
            summaries.append(result.summary_text)
            if memory is not None:
                memory += [item.content for item in result.memory_items]
    return summaries


async def test_fallback_summaries_merge_instead_of_nesting() -> None:
    memory: list[str] = []
    summaries = await _grow_and_compact(None, memory=memory)
    assert len(summaries) >= 3
    last = summaries[-1]
    assert last.count("Built without the model") == 1
    assert last.count("## Ledger of the condensed turns") == 1
    assert "Earlier summary" not in last and "chars omitted" not in last
    # Every folded request is carried in the summary, or moved to memory when it had no room.
    kept = "\n".join([last, *memory])
    assert all(f"Task {i}: edit src/module_{i}.py" in kept for i in range(1, 20))
    # oldest first when room is short: the requests read as a list a person can follow
    assert "Task 1: edit src/module_1.py" in last


async def test_a_forgetful_model_does_not_lose_what_code_collected() -> None:
    memory: list[str] = []
    lossy = await _grow_and_compact(ScriptedLLM(summary=LOSSY), memory=memory)
    plain = await _grow_and_compact(None)
    assert len(lossy) >= 3 and lossy[-1].startswith(LOSSY)
    kept = "\n".join([lossy[-1], *memory])
    assert all(f"Task {i}: edit src/module_{i}.py" in kept for i in range(1, 20))
    assert lossy[-1].count("## Ledger of the condensed turns") == 1
    requests = lossy[-1].count("  - Task ")
    assert requests >= plain[-1].count("  - Task ") - 1 and requests >= 3


async def test_a_huge_task_is_quoted_head_and_tail_and_carried_forward() -> None:
    task = "Fix the parser. " + "Context line for the bug report. " * 600 + "END OF TASK."
    messages = [system(), user(task)]
    for i in range(30):
        messages += [assistant(f"Step {i}: " + "reasoning " * 60), user(f"Go on with step {i}.")]
    compactor = Compactor(settings=SETTINGS)
    compaction = await compactor.prepare(messages, window=8_000)
    assert 1 in compaction.plan.quoted and 1 not in compaction.plan.pinned  # too big for 8k
    first = await compaction.run(llm=None, session_id=None)
    assert "Fix the parser." in first.summary_text and "END OF TASK." in first.summary_text
    assert "chars omitted" in first.summary_text
    grown = [*first.messages, *(user(f"More work {i}. " + "detail " * 80) for i in range(20))]
    assert split(grown, compactor.estimator).task is None  # the summary holds the task now
    compaction = await compactor.prepare(grown, window=8_000)
    second = await compaction.run(llm=None, session_id=None)
    assert is_summary_message(second.messages[1])
    assert "Fix the parser." in second.summary_text and "END OF TASK." in second.summary_text
