"""A run in process takes the folded Items from the plan that read them: the same result as
reading them again, and only for the very list the plan read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.corpus import read_corpus
from compaction import Compactor, HeuristicEstimator
from compaction.messages import CHAT, RESPONSES, Item
from compaction.reading import LastRead
from tests.compaction.conftest import ScriptedLLM
from tests.factories import assistant, system, user


class CountingShape:
    """The chat shape, counting the messages it reads and measures."""

    def __init__(self) -> None:
        self.reads = 0
        self.measures = 0

    def read(self, raw: Any) -> Item:
        self.reads += 1
        return CHAT.read(raw)

    def summary_message(self, text: str) -> Any:
        return CHAT.summary_message(text)

    def is_summary(self, raw: Any) -> bool:
        return CHAT.is_summary(raw)

    def measure(self, raw: Any, text_cost: Any) -> float:
        self.measures += 1
        return CHAT.measure(raw, text_cost)


async def test_runs_reuse_the_plans_items_with_the_same_result_on_corpus_conversations(
    corpus_dir: Path,
) -> None:
    compared = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in list(read_corpus(path))[:4]:
            messages = conversation["messages"]
            shape = CountingShape()
            compactor = Compactor(shape=shape)
            plan = compactor.plan(messages, window=8_000)
            if not plan.folded:
                continue
            before, measured = shape.reads, shape.measures
            reused = await compactor.run(messages, plan, llm=ScriptedLLM(), session_id=None)
            reads_reusing = shape.reads - before
            measures_reusing = shape.measures - measured
            copies = [dict(m) for m in messages]  # equal messages, other objects: read again
            before, measured = shape.reads, shape.measures
            fresh = await compactor.run(copies, plan, llm=ScriptedLLM(), session_id=None)
            # Counted again too (the run's estimator is the plan's: the compactor's own).
            assert shape.measures - measured == measures_reusing + len(plan.folded)
            assert reused.summary_text == fresh.summary_text
            assert reused.memory_items == fresh.memory_items
            assert reused.messages == fresh.messages
            if reused.path == "llm":  # the folded part was read (not too little to fold)
                assert shape.reads - before == reads_reusing + len(plan.folded)
                compared += 1
    assert compared >= 6


def test_items_are_handed_on_once_and_only_for_the_list_that_was_read() -> None:
    messages = [system(), user("one"), assistant("two"), user("three")]
    last = LastRead()
    items = last.read(messages, CHAT)
    assert last.take(messages, [1, 3], CHAT) == ([items[1], items[3]], None)
    assert last.take(messages, [1, 3], CHAT) is None  # let go once taken
    items = last.read(messages, CHAT)
    assert last.take(list(messages), [2], CHAT) == ([items[2]], None)  # a copy: same objects
    replaced = [*messages[:2], assistant("two"), messages[3]]
    for other, shape in ((replaced, CHAT), (messages[:3], CHAT), (messages, RESPONSES)):
        last.read(messages, CHAT)
        assert last.take(other, [2], shape) is None


def test_counts_are_handed_on_only_to_a_run_counting_with_the_same_estimator() -> None:
    messages = [system(), user("one " * 50), assistant("two"), user("three")]
    estimator, other = HeuristicEstimator(), HeuristicEstimator(calibration=2.0)
    counts = [estimator.count_message(m) for m in messages]
    last = LastRead()
    for taker, expected in ((estimator, [counts[1], counts[3]]), (other, None), (None, None)):
        items = last.read(messages, CHAT)
        last.counted(counts, estimator)
        assert last.take(messages, [1, 3], CHAT, taker) == ([items[1], items[3]], expected)
    last.read(messages, CHAT)  # read again, not counted: nothing to hand on but the items
    assert last.take(messages, [1], CHAT, estimator) == ([items[1]], None)
