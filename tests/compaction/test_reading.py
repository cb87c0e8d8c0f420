"""A run in process takes the folded Items from the plan that read them: the same result as
reading them again, and only for the very list the plan read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.corpus import read_corpus
from compaction import Compactor
from compaction.messages import CHAT, RESPONSES, Item
from compaction.reading import LastRead
from tests.compaction.conftest import ScriptedLLM
from tests.factories import assistant, system, user


class CountingShape:
    """The chat shape, counting the messages it reads."""

    def __init__(self) -> None:
        self.reads = 0

    def read(self, raw: Any) -> Item:
        self.reads += 1
        return CHAT.read(raw)

    def summary_message(self, text: str) -> Any:
        return CHAT.summary_message(text)

    def is_summary(self, raw: Any) -> bool:
        return CHAT.is_summary(raw)

    def measure(self, raw: Any, text_cost: Any) -> float:
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
            before = shape.reads
            reused = await compactor.run(messages, plan, llm=ScriptedLLM(), session_id=None)
            reads_reusing = shape.reads - before
            copies = [dict(m) for m in messages]  # equal messages, other objects: read again
            before = shape.reads
            fresh = await compactor.run(copies, plan, llm=ScriptedLLM(), session_id=None)
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
    assert last.take(messages, [1, 3], CHAT) == [items[1], items[3]]
    assert last.take(messages, [1, 3], CHAT) is None  # let go once taken
    items = last.read(messages, CHAT)
    assert last.take(list(messages), [2], CHAT) == [items[2]]  # a copy of the list: same objects
    replaced = [*messages[:2], assistant("two"), messages[3]]
    for other, shape in ((replaced, CHAT), (messages[:3], CHAT), (messages, RESPONSES)):
        last.read(messages, CHAT)
        assert last.take(other, [2], shape) is None
