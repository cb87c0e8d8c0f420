"""A compaction run in process takes the folded Items and tokens from the plan that read them:
the same result as reading them again, and only once (the reading holds the whole history)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.corpus import read_corpus
from compaction import CHAT, Compaction, CompactionSettings, Compactor, HeuristicEstimator, Item
from tests.compaction.conftest import ScriptedLLM
from tests.factories import agent_conversation


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

    def with_output(self, raw: Any, reduce: Any) -> Any:
        return CHAT.with_output(raw, reduce)


async def test_runs_reuse_the_plans_items_with_the_same_result_on_corpus_conversations(
    corpus_dir: Path,
) -> None:
    compared = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in list(read_corpus(path))[:4]:
            messages = conversation["messages"]
            shape = CountingShape()
            compactor = Compactor(shape=shape)
            compaction = await compactor.prepare(messages, window=8_000)
            plan = compaction.plan
            if not plan.folded:
                continue
            before, measured = shape.reads, shape.measures
            reused = await compaction.run(llm=ScriptedLLM(), session_id=None)
            reads_reusing = shape.reads - before
            measures_reusing = shape.measures - measured
            copies = [dict(m) for m in messages]  # equal messages, other objects: read again
            before, measured = shape.reads, shape.measures
            fresh = await Compaction(compactor, copies, plan).run(
                llm=ScriptedLLM(), session_id=None
            )
            # Counted again too (the run's estimator is the plan's: the compactor's own).
            assert shape.measures - measured == measures_reusing + len(plan.folded)
            assert reused.summary_text == fresh.summary_text
            assert reused.memory_items == fresh.memory_items
            assert reused.messages == fresh.messages
            if reused.path == "llm":  # the folded part was read (not too little to fold)
                assert shape.reads - before == reads_reusing + len(plan.folded)
                compared += 1
    assert compared >= 6


async def test_the_plans_reading_serves_one_run_and_a_second_reads_for_itself() -> None:
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    shape = CountingShape()
    compactor = Compactor(shape=shape)
    compaction = await compactor.prepare(messages, window=int(compactor.estimate(messages) / 0.9))
    folded = len(compaction.plan.folded)
    reads, measures, summaries = [], [], []
    for _ in range(2):
        before, measured = shape.reads, shape.measures
        result = await compaction.run(llm=ScriptedLLM(), session_id=None)
        reads.append(shape.reads - before)
        measures.append(shape.measures - measured)
        summaries.append(result.summary_text)
    assert reads[1] == reads[0] + folded and measures[1] == measures[0] + folded
    assert summaries[0] == summaries[1]


async def test_the_plans_counts_are_by_the_estimator_the_compaction_runs_with() -> None:
    # A request's own estimator (calibrated) plans and runs: the result is the one a run
    # counting afresh gives.
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    # A summary (long outputs would be previews under the default strategy).
    compactor = Compactor(settings=CompactionSettings(strategy="summary"))
    estimator = HeuristicEstimator(calibration=2.0, shape=CHAT)
    window = int(compactor.estimate(messages, estimator=estimator) / 0.9)
    compaction = await compactor.prepare(messages, window=window, estimator=estimator)
    reused = await compaction.run(llm=ScriptedLLM(), session_id=None)
    fresh = await Compaction(compactor, messages, compaction.plan, estimator=estimator).run(
        llm=ScriptedLLM(), session_id=None
    )
    assert reused.path == fresh.path == "llm"
    assert (reused.tokens_after, reused.summary_text) == (fresh.tokens_after, fresh.summary_text)
