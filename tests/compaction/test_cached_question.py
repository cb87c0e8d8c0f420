"""The cached summary request's question (compaction.summarize): asked once after the
conversation's own request when the summarizer can and the window has room, its answer split
into the summary and the memory items; standalone otherwise."""

from __future__ import annotations

from dataclasses import dataclass, field

from compaction import CHAT, Compactor, PrefixLLM
from compaction.extract import parse_memory_reply
from compaction.summarize import (
    MIN_CACHED_MEMORY_TOKENS,
    Question,
    Reply,
    ask_summarizer,
    build_cached_question,
    describe_kept,
    split_answer,
)
from compaction.types import Message, Purpose
from tests import factories as f

SUMMARY = "## Goals and requests\n- Fix the failing parser test in src/parse.py."
MEMORY = '[{"type": "decision", "content": "Keep the standard library only."}]'
ANSWER = f"<summary>\n{SUMMARY}\n</summary>\n<memory>\n{MEMORY}\n</memory>"


@dataclass
class Standalone:
    """A summarizer that can only ask standalone requests."""

    calls: list[tuple[Purpose, list[Message]]] = field(default_factory=list)

    async def complete(self, messages: list[Message], *, purpose: Purpose, max_tokens: int) -> str:
        self.calls.append((purpose, messages))
        return SUMMARY if purpose == "summary" else MEMORY


@dataclass
class AfterPrefix(Standalone):
    """A summarizer that can also ask after the conversation's request, with `room` left."""

    room: int = 100_000
    questions: list[tuple[str, int]] = field(default_factory=list)
    answer: str = ANSWER

    @property
    def room_after_prefix(self) -> int:
        return self.room

    async def complete_after_prefix(
        self, instruction: str, *, purpose: Purpose, max_tokens: int
    ) -> str:
        self.questions.append((instruction, max_tokens))
        return self.answer


def question(previous: str | None = None) -> Question:
    return Question(
        transcript="user: fix the parser",
        previous_summary=previous,
        summary_max_tokens=500,
        memory_max_tokens=1500,
        cjk=False,
        kept='the last 4 messages, from the one that begins "Now run the tests",',
    )


def test_a_summarizer_that_asks_after_the_prefix_is_a_prefix_llm() -> None:
    assert isinstance(AfterPrefix(), PrefixLLM)
    assert not isinstance(Standalone(), PrefixLLM)


async def test_one_cached_question_brings_the_summary_and_the_memory_items() -> None:
    llm = AfterPrefix()
    summary, memory, calls = await ask_summarizer(llm, question(), timeout_s=5)
    assert calls == 1
    assert summary.text == SUMMARY and summary.error is None
    assert memory.text is not None and parse_memory_reply(memory.text) is not None
    assert llm.calls == []  # no standalone request, no second transcript
    [(instruction, max_tokens)] = llm.questions
    assert '"Now run the tests"' in instruction and "<memory>" in instruction
    assert "at most 500 tokens" in instruction and max_tokens == 500 + 1500


async def test_without_room_after_the_prefix_the_summary_alone_is_asked_standalone() -> None:
    """The memory items are mined by code then: no second transcript at the full price."""
    llm = AfterPrefix(room=500 + MIN_CACHED_MEMORY_TOKENS)  # the question itself takes more
    summary, memory, calls = await ask_summarizer(llm, question(), timeout_s=5)
    assert llm.questions == [] and calls == 1
    assert [purpose for purpose, _ in llm.calls] == ["summary"]
    assert summary.text == SUMMARY and memory == Reply(None, None)


async def test_a_summarizer_that_cannot_ask_cached_asks_summary_and_memory_standalone() -> None:
    llm = Standalone()
    summary, memory, calls = await ask_summarizer(llm, question(), timeout_s=5)
    assert calls == 2
    assert sorted(purpose for purpose, _ in llm.calls) == ["memory", "summary"]
    assert summary.text == SUMMARY and memory.text == MEMORY


async def test_little_room_shortens_the_memory_part_rather_than_overflow_the_window() -> None:
    llm = AfterPrefix(room=2500)
    await ask_summarizer(llm, question(), timeout_s=5)
    [(instruction, max_tokens)] = llm.questions
    assert max_tokens + len(instruction) // 3 <= 2500


async def test_an_answer_without_a_memory_part_keeps_its_summary_and_is_no_failure() -> None:
    """Code mines the memory items then: no error, so no warning per compaction."""
    llm = AfterPrefix(answer=SUMMARY)
    summary, memory, _ = await ask_summarizer(llm, question(), timeout_s=5)
    assert summary.text == SUMMARY
    assert memory.text is None and memory.error is None


async def test_room_for_the_summary_alone_asks_one_cached_question_without_memory() -> None:
    """Near the window's end: the summary asked after the prefix at the cached price, the
    memory items left to code, rather than two standalone requests at the full price."""
    full = build_cached_question(kept="k", previous_summary=False, max_tokens=500, cjk=False)
    llm = AfterPrefix(room=500 + len(full) // 3 + MIN_CACHED_MEMORY_TOKENS - 1, answer=SUMMARY)
    summary, memory, calls = await ask_summarizer(llm, question(), timeout_s=5)
    assert calls == 1 and llm.calls == []
    [(instruction, max_tokens)] = llm.questions
    assert "<memory>" not in instruction and max_tokens == 500
    assert "at most 500 tokens." in instruction
    assert summary.text == SUMMARY and memory == Reply(None, None)


async def test_a_compaction_without_the_memory_part_mines_its_items_and_reports_no_error() -> None:
    messages = f.agent_conversation(rounds=12)
    messages.insert(2, f.user("From now on, please never use tabs in this repository."))
    messages.insert(3, f.assistant("Understood."))
    compactor = Compactor()
    window = compactor.estimate(messages) * 3
    compaction = await compactor.prepare(messages, window=window, target_ratio=0.2)
    result = await compaction.run(
        llm=AfterPrefix(answer=SUMMARY), session_id=None, flush_memory=False
    )
    assert result.path == "llm" and result.errors == () and result.model_calls == 1
    assert any("never use tabs" in item.content for item in result.memory_items)  # by code


async def test_a_refusal_after_the_prefix_is_a_failed_summary() -> None:
    llm = AfterPrefix(answer="I'm sorry, I can't help with that.")
    summary, _, _ = await ask_summarizer(llm, question(), timeout_s=5)
    assert summary.text is None and summary.error is not None


def test_the_answer_splits_into_summary_and_memory_parts_in_either_order() -> None:
    assert split_answer(ANSWER) == (SUMMARY, MEMORY)
    assert split_answer(f"<memory>{MEMORY}</memory>\n<summary>{SUMMARY}</summary>") == (
        SUMMARY,
        MEMORY,
    )
    assert split_answer(f"{SUMMARY}\n<memory>{MEMORY}") == (SUMMARY, MEMORY)  # cut short


def test_an_update_asks_to_merge_the_earlier_summary() -> None:
    fresh = build_cached_question(kept="k", previous_summary=False, max_tokens=9, cjk=False)
    update = build_cached_question(kept="k", previous_summary=True, max_tokens=9, cjk=False)
    assert "ONE updated summary" in update and "ONE updated summary" not in fresh


def test_the_kept_part_is_named_by_its_count_and_opening_words() -> None:
    messages = [f.system(), f.user("first"), f.assistant("one"), f.user("Now run  the\ntests")]
    assert (
        describe_kept(messages, 3, CHAT)
        == 'the last message, from the one that begins "Now run the tests",'
    )
    assert describe_kept(messages, 1, CHAT).startswith(
        'the last 3 messages, from the one that begins "first"'
    )


async def test_a_compaction_asks_after_the_prefix_once_and_flushes_the_answers_items() -> None:
    messages = f.agent_conversation(rounds=12)
    compactor = Compactor()
    window = compactor.estimate(messages) * 3
    compaction = await compactor.prepare(messages, window=window, target_ratio=0.2)
    llm = AfterPrefix()
    result = await compaction.run(llm=llm, session_id=None, flush_memory=False)
    assert result.path == "llm" and len(llm.questions) == 1 and llm.calls == []
    assert "Fix the failing parser test" in result.summary_text
    assert any(item.content == "Keep the standard library only." for item in result.memory_items)
