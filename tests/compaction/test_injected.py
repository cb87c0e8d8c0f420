"""What a client injects into a user turn is context, never the person's request: not the task,
not a round's request, not a listed request; the person's later prompts are kept whole."""

from __future__ import annotations

from typing import Any

import orjson

from compaction import ANTHROPIC, RESPONSES, CompactionSettings, Compactor, read_items
from compaction.ledger import build_ledger
from compaction.segment import split
from compaction.tokens import HeuristicEstimator

ENVIRONMENT = (
    "<environment_context>\n  <cwd>/home/dev/project</cwd>\n  <shell>bash</shell>\n"
    "  <current_date>2026-11-27</current_date>\n  <timezone>Etc/UTC</timezone>\n"
    "</environment_context>"
)
AGENTS = (
    "# AGENTS.md instructions for /home/dev/project\n\n<INSTRUCTIONS>\nRun make test before "
    "committing.\n</INSTRUCTIONS>"
)
REMINDER = "<system-reminder>\nThe user's CLAUDE.md says: use tabs.\n</system-reminder>"
TASK = "Tally the words of every file under notes/ and report the total."
# A follow-up of 2,555 characters, as the one `codex exec resume` lost after its first 300.
FOLLOW_UP = " ".join(
    f"Step {n}: count the lines of notes/part{n}.txt again and compare them with the earlier tally."
    for n in range(30)
)[:2555]


def _item(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _calls(start: int, count: int, output_chars: int = 1500) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(start, start + count):
        arguments = orjson.dumps({"command": ["wc", "-l", f"notes/part{n}.txt"]}).decode()
        items.append(
            {"type": "function_call", "call_id": f"c{n}", "name": "shell", "arguments": arguments}
        )
        items.append(
            {"type": "function_call_output", "call_id": f"c{n}", "output": "x" * output_chars}
        )
    return items


def codex_input(*, resumed: bool) -> list[dict[str, Any]]:
    """A Codex CLI conversation as its Responses `input`: AGENTS.md and the environment context
    as user items before the task, a tool loop; resumed, the follow-up then a fresh environment
    context item (as `exec resume` sends them) and another tool loop."""
    items = [
        _item("developer", "<permissions instructions>sandbox: none</permissions>"),
        _item("user", AGENTS),
        _item("user", ENVIRONMENT),
        _item("user", TASK),
        *_calls(0, 6),
        _item("assistant", "The total is 4,210 words."),
    ]
    if resumed:
        items += [_item("user", FOLLOW_UP), _item("user", ENVIRONMENT), *_calls(6, 24)]
    return items


def test_codex_context_items_are_neither_the_task_nor_requests() -> None:
    items = codex_input(resumed=False)
    read = read_items(items, RESPONSES)
    assert [i.is_request for i in read[1:4]] == [False, False, True]
    segments = split(items, HeuristicEstimator(shape=RESPONSES), shape=RESPONSES)
    assert segments.task == 3
    assert build_ledger(read, range(len(read))).requests == (TASK,)


def test_a_claude_code_reminder_is_not_part_of_the_request() -> None:
    turn = {
        "role": "user",
        "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": TASK}],
    }
    reminder_only = {"role": "user", "content": [{"type": "text", "text": REMINDER}]}
    first, second = read_items([turn, reminder_only], ANTHROPIC)
    assert first.is_request and first.text == TASK
    assert not second.is_request and second.text == REMINDER  # kept as context
    assert build_ledger([first, second], range(2)).requests == (TASK,)


async def test_a_long_prompt_after_a_resume_reaches_the_model_whole() -> None:
    items = codex_input(resumed=True)
    compactor = Compactor(settings=CompactionSettings(keep_recent_rounds=1), shape=RESPONSES)
    estimator = HeuristicEstimator(shape=RESPONSES)
    compaction = await compactor.prepare(items, window=12000, estimator=estimator)
    result = await compaction.run(llm=None, session_id=None)
    assert result.path == "extractive"
    assert any(m is items[3] for m in result.messages), "the task is a message of its own"
    forwarded = orjson.dumps(result.messages).decode()
    assert FOLLOW_UP in forwarded, "the follow-up is not whole"


async def test_a_long_prompt_folded_whole_is_listed_whole() -> None:
    items = codex_input(resumed=True)
    items += [_item("assistant", "All 30 steps ran."), _item("user", "Now stop."), *_calls(30, 24)]
    compactor = Compactor(settings=CompactionSettings(keep_recent_rounds=1), shape=RESPONSES)
    estimator = HeuristicEstimator(shape=RESPONSES)
    compaction = await compactor.prepare(items, window=16000, estimator=estimator)
    assert items.index(_item("user", FOLLOW_UP)) in compaction.plan.folded
    result = await compaction.run(llm=None, session_id=None)
    kept = orjson.dumps(result.messages).decode() + "".join(i.content for i in result.memory_items)
    assert FOLLOW_UP in kept
