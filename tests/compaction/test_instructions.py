"""Standing instructions: what the user laid down reaches the model after every compaction."""

from __future__ import annotations

import json
from typing import Any

from compaction import CompactionSettings, Compactor
from compaction.instructions import Instruction, find_instructions, merge_instructions
from compaction.messages import read_items
from compaction.pinned import PINNED_HEADING, read_pinned, render_pinned
from compaction.tokens import HeuristicEstimator
from compaction.types import Message
from tests.compaction.conftest import ScriptedLLM, text_of

ESTIMATOR = HeuristicEstimator()


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _work(number: int, size: int = 1200) -> list[Message]:
    """A neutral round: nothing the user lays down in it."""
    return [
        _user(f"Continue with work item {number}."),
        {"role": "assistant", "content": f"Worked on item {number}: " + "x " * size},
    ]


def _found(*texts: str) -> list[Instruction]:
    return find_instructions(read_items([_user(t) for t in texts]))


def test_rules_constraints_decisions_and_facts_are_found_verbatim() -> None:
    found = _found(
        "Never delete anything under data/ without asking me first.",
        "Keep total spend under the budget cap of $500.",
        "We decided that the release codename is KESTREL-7.",
        "I prefer short answers without tables.",
        "The production database runs in eu-west-3.",
        "Continue with work item 58.",
        "Can you look at the failing build?",
    )
    assert [(i.kind, i.text) for i in found] == [
        ("rule", "Never delete anything under data/ without asking me first."),
        ("constraint", "Keep total spend under the budget cap of $500."),
        ("decision", "We decided that the release codename is KESTREL-7."),
        ("preference", "I prefer short answers without tables."),
        ("fact", "The production database runs in eu-west-3."),
    ]


def test_a_client_injected_context_block_and_tool_output_are_not_the_user_speaking() -> None:
    messages: list[Message] = [
        _user(
            "<environment_context>\n  <cwd>/repo</cwd>\n  Never use sudo.\n</environment_context>"
        ),
        {"role": "user", "content": "<returncode>0</returncode>\n<output>must not fail</output>"},
    ]
    assert find_instructions(read_items(messages)) == []


def test_a_long_message_gives_only_its_instructing_sentences() -> None:
    filler = "Here is some background on the module layout and how the pieces fit. " * 8
    found = _found(filler + "Never force-push to main. " + filler)
    assert [i.text for i in found] == ["Never force-push to main."]


def test_the_section_ranks_by_kind_and_never_by_recency() -> None:
    instructions = merge_instructions(
        [],
        _found(
            "FACT: The staging host is api.staging.internal.",
            "Going with PostgreSQL 16 for the store, we decided.",
            "Never run migrations on production.",
        ),
    )
    text = render_pinned(instructions, budget=500, estimator=ESTIMATOR).text
    lines = text.splitlines()
    assert lines[0] == PINNED_HEADING
    assert [line.split("]")[0] for line in lines[1:]] == ["- [rule", "- [decision", "- [fact"]


def test_a_statement_said_twice_is_kept_once() -> None:
    merged = merge_instructions(
        _found("Never delete the audit log."), _found("never delete the audit log")
    )
    assert [i.text for i in merged] == ["Never delete the audit log."]


def test_a_later_statement_supersedes_an_earlier_one_and_both_stay_visible() -> None:
    old = "HARD CONSTRAINT: Budget cap is $300 total. Never exceed without explicit approval."
    merged = merge_instructions(
        _found(old),
        _found("HARD CONSTRAINT: Total spending is capped at $700; exceeding it needs approval."),
    )
    text = render_pinned(merged, budget=500, estimator=ESTIMATOR).text
    assert text.splitlines()[1:] == [
        "- [constraint] HARD CONSTRAINT: Total spending is capped at $700; exceeding it needs"
        " approval.",
        "- [constraint, superseded by a later statement] HARD CONSTRAINT: Budget cap is $300"
        " total. Never exceed without explicit approval.",
    ]
    # Read back by a later compaction, the marks hold; said again, the old value is back in force.
    again = merge_instructions(read_pinned(text).instructions, _found(old))
    assert [i.superseded for i in again] == [True, False]


def test_what_exceeds_the_budget_is_counted_in_one_line_and_left_out() -> None:
    instructions = [
        Instruction("rule", f"Never touch module number {i} at all.") for i in range(40)
    ]
    pinned = render_pinned(instructions, budget=120, estimator=ESTIMATOR, earlier_overflow=2)
    lines = pinned.text.splitlines()
    assert 0 < len(lines) - 2 < 40 and ESTIMATOR.count_text(pinned.text) <= 120
    assert (
        lines[-1]
        == f"- ({2 + len(pinned.left_out)} more had no room here: they are in the memory file.)"
    )
    assert read_pinned(pinned.text).overflow == 2 + len(pinned.left_out)
    assert {i.content for i in pinned.memory_items()} == {i.text for i in pinned.left_out}


# ---------------------------------------------------------------- through the compactor


async def _compact(
    compactor: Compactor, messages: list[Message], llm: Any, window: int
) -> list[Message]:
    compaction = await compactor.prepare(messages, window=window)
    result = await compaction.run(llm=llm, session_id=None)
    assert result.path in ("llm", "extractive")
    return result.messages


async def test_instructions_survive_compaction_after_compaction_with_a_generic_summarizer() -> None:
    compactor = Compactor()
    llm = ScriptedLLM(summary="The user and the assistant worked on several items.")
    rules = [
        "SAFETY RULE: Never disclose the vault code qzr-41 to any user.",
        "HARD CONSTRAINT: Budget cap is $650 total. Never exceed without explicit approval.",
        "USER PREFERENCE: User wants code examples in Kotlin, not other languages.",
    ]
    messages: list[Message] = [{"role": "system", "content": "You are a coding agent."}]
    for rule in rules:
        messages += [_user(rule), {"role": "assistant", "content": "Noted."}]
    number = 0
    for step in range(6):  # six compactions, each folding the previous summary
        while not compactor.needs_compaction(compactor.estimate(messages), 8000):
            number += 1
            messages += _work(number)
        messages = await _compact(compactor, messages, llm, window=8000)
        forwarded = text_of(messages)
        assert all(rule in forwarded for rule in rules), step
    assert text_of(messages).count(PINNED_HEADING) == 1


_PREAMBLE = " ".join(
    ["The walkthrough covered the build graph, the cache keys and the flaky integration job."] * 4
)


async def _chat_of_decisions(decisions: list[str], pinned_ratio: float) -> str:
    """A long chat in which the user states `decisions` between work rounds, compacted at each
    trigger by a summarizer that keeps every other decision it is shown (in its text and in
    its memory items); what the model receives at the end."""

    def kept_half(request: list[Message]) -> list[str]:
        shown = str(request[-1]["content"])
        return [d for d in decisions if d in shown][::2]

    async def summary(request: list[Message]) -> str:
        return "Decisions:\n" + "\n".join(f"- {d}" for d in kept_half(request))

    async def memory(request: list[Message]) -> str:
        return json.dumps([{"type": "decision", "content": d} for d in kept_half(request)])

    llm = ScriptedLLM(summary=summary, memory=memory)
    compactor = Compactor(settings=CompactionSettings(pinned_ratio=pinned_ratio))
    messages: list[Message] = [{"role": "system", "content": "You are a release assistant."}]
    for number, decision in enumerate(decisions):
        # Said after a long preamble: a request is listed by its opening only.
        said = f"Review notes for item {number}: {_PREAMBLE} {decision}"
        messages += [_user(said), {"role": "assistant", "content": "Recorded."}]
        messages += _work(number, size=500)
        if compactor.needs_compaction(compactor.estimate(messages), 16000):
            messages = await _compact(compactor, messages, llm, window=16000)
    for number in range(40, 60):  # the chat goes on: every decision is folded by now
        messages += _work(number, size=500)
        if compactor.needs_compaction(compactor.estimate(messages), 16000):
            messages = await _compact(compactor, messages, llm, window=16000)
    return text_of(messages)


async def test_thirty_two_user_decisions_survive_a_summarizer_that_drops_half() -> None:
    # Words, not numbers: no identifier list can carry them by accident.
    names = ["".join(chr(97 + (i * 7 + k * 3) % 26) for k in range(6)) for i in range(64)]
    decisions = [
        f"We decided that the release codename of the {names[i]} service is {names[32 + i].upper()}."
        for i in range(32)
    ]
    forwarded = await _chat_of_decisions(decisions, pinned_ratio=0.10)
    assert [d for d in decisions if d not in forwarded] == []
    # The section is what keeps them: without its room, that summarizer loses some.
    assert [d for d in decisions if d not in await _chat_of_decisions(decisions, 0.0)] != []


async def test_the_overflow_is_counted_in_the_result_and_written_to_memory() -> None:
    rules = [f"Never rename the table orders_{i} without a migration note." for i in range(30)]
    messages: list[Message] = []
    for rule in rules:
        messages += [_user(rule), {"role": "assistant", "content": "Noted. " + "y " * 200}]
    messages += _work(1) + _work(2)
    compactor = Compactor(settings=CompactionSettings(pinned_ratio=0.02))
    compaction = await compactor.prepare(messages, window=8000)
    result = await compaction.run(llm=None, session_id=None)
    assert result.pinned_overflow > 0
    as_messages = {m["content"] for m in result.messages}
    folded = [rule for rule in rules if rule not in as_messages]
    section = result.summary_text.split("\n\n")[0]
    kept = [rule for rule in folded if rule in section]
    assert len(kept) + result.pinned_overflow == len(folded)
    assert f"- ({result.pinned_overflow} more had no room here" in result.summary_text
    in_memory = {item.content for item in result.memory_items}
    assert {rule for rule in folded if rule not in kept} <= in_memory
