"""The Compactor run: paths, fallbacks and checks, with a scripted LLM passed in."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction import (
    SUMMARY_MARKER,
    Compaction,
    CompactionSettings,
    Compactor,
    JsonArray,
    MemoryWriter,
    Message,
    OffloadLost,
    Plan,
    is_summary_message,
    summary_text,
)
from compaction.invariants import check_compacted, check_tool_pairing
from tests.compaction.conftest import ScriptedLLM, memory_reply, sleep_forever
from tests.factories import agent_conversation, conversations, simple_conversation
from tests.fakes.offload import LosingOffload, PicklingOffload, RecordingOffload

FAST = CompactionSettings(llm_timeout_s=0.2)


def _over(compactor: Compactor, messages: list[Any], ratio: float = 0.9) -> int:
    """A window at which `messages` sits at `ratio` of it (so it triggers)."""
    return int(compactor.estimate(messages) / ratio)


async def _compact(
    messages: list[Any],
    llm: Any,
    *,
    compactor: Compactor | None = None,
    session_id: str | None = None,
) -> Any:
    compactor = compactor or Compactor(settings=FAST)
    window = _over(compactor, messages)
    compaction = await compactor.prepare(messages, window=window)
    result = await compaction.run(llm=llm, session_id=session_id)
    return result, compaction.plan, window


async def test_a_compaction_sends_the_history_serialized_once_by_its_plan(
    llm: ScriptedLLM,
) -> None:
    # Serializing the whole history costs the caller's loop: the run sends what the plan sent,
    # and a compaction of a plan made elsewhere serializes its messages itself.
    offload = RecordingOffload()
    compactor = Compactor(settings=FAST, offload=offload)
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    window = _over(compactor, messages)
    compaction = await compactor.prepare(messages, window=window)
    assert (await compaction.run(llm=llm, session_id=None)).path == "llm"
    planned, folding, finishing = offload.jobs
    assert planned.messages.json is not None
    assert folding.messages is planned.messages and finishing.messages is planned.messages

    equal = [dict(message) for message in messages]  # the same content, other objects
    other = Compaction(compactor, equal, compaction.plan)
    assert (await other.run(llm=llm, session_id=None)).path == "llm"
    folding = offload.jobs[3]
    assert folding.messages is not planned.messages
    assert folding.messages.json == planned.messages.json


async def test_a_plan_takes_the_callers_json_of_the_messages_and_its_run_too(
    llm: ScriptedLLM,
) -> None:
    # The proxy has its client's bytes of the history: they cross to the worker as they are.
    offload = RecordingOffload()
    compactor = Compactor(settings=FAST, offload=offload)
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    window = _over(compactor, messages)
    # A request body as a client might write it; the array is where its brackets are.
    body = json.dumps({"model": "m", "messages": messages}, indent=1).encode()
    sent = JsonArray(body, body.index(b"["), body.rindex(b"]") + 1)
    compaction = await compactor.prepare(messages, window=window, messages_json=sent)
    assert (await compaction.run(llm=llm, session_id=None)).path == "llm"
    planned, folding, finishing = offload.jobs
    assert planned.messages.json is sent
    assert folding.messages.json is sent and finishing.messages.json is sent
    assert compaction.plan == compactor.plan(messages, window=window)  # as from the objects


async def test_a_finished_compaction_sends_back_its_texts_once(llm: ScriptedLLM) -> None:
    # A worker's result is unpickled in one call that holds the proxy's GIL as long: a long
    # fold's overflow went back three times (as ledger entries, as memory items, and as those
    # items' identities), 70 MiB for a 53 MiB history.
    offload = PicklingOffload()
    settings = CompactionSettings(llm_timeout_s=0.2, summary_max_tokens=256)
    compactor = Compactor(settings=settings, offload=offload)
    messages = agent_conversation(400, blocks=4, output_chars=100)  # more than a summary holds
    compaction = await compactor.prepare(messages, window=_over(compactor, messages))
    result = await compaction.run(llm=llm, session_id=None)
    assert result.path == "llm" and result.verification is not None
    texts = [item.content for item in result.memory_items]
    carried = sum(map(len, [*texts, *result.verification.missing_key_info, result.summary_text]))
    assert sum(map(len, texts)) > 10_000
    assert len(offload.results[-1]) < 1.3 * carried


async def test_the_compactor_keeps_nothing_of_a_compaction(llm: ScriptedLLM) -> None:
    # What a plan read or serialized lives in its Compaction: one that is never run (a
    # precomputed one already stored elsewhere) takes it along when the caller lets it go.
    for offload in (RecordingOffload(), None):
        compactor = Compactor(settings=FAST, offload=offload)
        before = dict(vars(compactor))
        messages = agent_conversation(8, blocks=4, output_chars=1500)
        compaction = await compactor.prepare(messages, window=_over(compactor, messages))
        assert (await compaction.run(llm=llm, session_id=None)).path == "llm"
        assert vars(compactor) == before


# ---------------------------------------------------------------- the LLM path


async def test_llm_summary_path_builds_the_planned_list(llm: ScriptedLLM) -> None:
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    result, plan, _window = await _compact(messages, llm)
    assert result.path == "llm"
    assert "keep the build green" in result.summary_text
    assert "## Ledger" in result.summary_text  # ledgers are appended to the model's text too
    head, kept = messages[: plan.head_end], messages[plan.keep_from :]
    assert all(a is b for a, b in zip(result.messages, head, strict=False))
    assert is_summary_message(result.messages[plan.head_end])
    assert all(a is b for a, b in zip(result.messages[result.prefix_len :], kept, strict=False))
    assert result.messages[result.prefix_len :] == kept and result.keep_from == plan.keep_from
    assert check_compacted(messages, result.messages, plan) == []
    assert result.tokens_after <= plan.target_tokens and result.fits
    assert result.tokens_after == Compactor().estimate(result.messages)
    assert result.folded_count == len(plan.folded) and len(result.compaction_id) == 32
    assert result.verification is not None


async def test_requests_carry_purpose_and_bounded_max_tokens(llm: ScriptedLLM) -> None:
    await _compact(agent_conversation(8, blocks=4, output_chars=1500), llm)
    assert sorted(c.purpose for c in llm.calls) == ["memory", "summary"]
    summary_call = next(c for c in llm.calls if c.purpose == "summary")
    assert 64 <= summary_call.max_tokens <= 2000
    assert "Goals and requests" in summary_call.messages[0]["content"]


async def test_summary_and_memory_calls_overlap() -> None:
    started = {"summary": asyncio.Event(), "memory": asyncio.Event()}

    def waits_for(other: str, mine: str, answer: str) -> Any:
        async def reply(_messages: list[Message]) -> str:
            started[mine].set()
            await asyncio.wait_for(started[other].wait(), timeout=5)
            return answer

        return reply

    llm = ScriptedLLM(
        summary=waits_for("memory", "summary", "Goals: overlap proven with both calls in flight."),
        memory=waits_for("summary", "memory", memory_reply(("fact", "Calls overlap"))),
    )
    result, _, _ = await _compact(
        agent_conversation(8, blocks=4, output_chars=1500),
        llm,
        compactor=Compactor(settings=CompactionSettings(llm_timeout_s=10)),
    )
    assert result.path == "llm" and result.errors == ()


@pytest.mark.parametrize(
    "reply",
    [
        RuntimeError("upstream 500"),
        sleep_forever,
        "",
        "   ",
        "???!!! 42",
        "ok",
        "I'm sorry, but I can't help with summarizing this conversation.",
    ],
    ids=["raises", "times-out", "empty", "blank", "no-letters", "too-short", "refusal"],
)
async def test_a_failing_summarizer_falls_back_and_still_fits(reply: Any) -> None:
    llm = ScriptedLLM(summary=reply)
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    result, plan, _ = await _compact(messages, llm)
    assert result.path == "extractive"
    assert any("summary call failed" in e for e in result.errors)
    assert messages[1] in result.messages  # the task is pinned, not folded
    assert "Task 1: edit src/module_1.py" in result.summary_text  # folded requests survive
    assert "src/module_1.py" in result.summary_text
    assert result.tokens_after <= plan.target_tokens and result.fits
    assert check_compacted(messages, result.messages, plan) == []


async def test_memory_items_come_from_the_model_and_reach_the_summary(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        memory="Sure!\n```json\n"
        + memory_reply(
            ("decision", "Use PostgreSQL 16 for storage"), ("todo", "Add an index on users.email")
        )
        + "\n```"
    )
    compactor = Compactor(settings=FAST, memory=MemoryWriter(tmp_path))
    result, _, _ = await _compact(
        agent_conversation(8, blocks=4, output_chars=1500),
        llm,
        compactor=compactor,
        session_id="agent-1",
    )
    assert "Use PostgreSQL 16 for storage" in result.summary_text  # appended as "Also preserved"
    lines = (tmp_path / "agent-1" / "compaction_flush.jsonl").read_text().splitlines()
    contents = [json.loads(line)["content"] for line in lines]
    assert "Add an index on users.email" in contents
    assert all(json.loads(line)["compaction_id"] == result.compaction_id for line in lines)


async def test_without_llm_memory_comes_from_keywords() -> None:
    messages = simple_conversation(12)
    assert messages[3]["role"] == "user"  # messages[1] is the task: pinned, not folded
    messages[3] = {
        "role": "user",
        "content": "We decided to use Redis for caching. I prefer short answers.",
    }
    result, _, _ = await _compact(messages, None)
    assert result.path == "extractive"
    assert {(i.type, i.content) for i in result.memory_items} >= {
        ("decision", "We decided to use Redis for caching."),
        ("preference", "I prefer short answers."),
    }


async def test_tiny_summary_budget_drops_with_a_note() -> None:
    compactor = Compactor(
        settings=CompactionSettings(summary_max_tokens=140, summary_window_ratio=1.0)
    )
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    plan = compactor.plan(messages, window=_over(compactor, messages))
    plan = type(plan)(**{**plan.__dict__, "summary_budget_tokens": 100})
    result = await Compaction(compactor, messages, plan).run(llm=None, session_id=None)
    assert result.path == "dropped"
    assert "earlier messages were omitted" in result.summary_text


# ---------------------------------------------------------------- previous summaries


async def test_a_folded_previous_summary_is_updated_not_stacked(llm: ScriptedLLM) -> None:
    first, _, window = await _compact(agent_conversation(10, blocks=4, output_chars=1500), llm)
    assert first.path == "llm"
    grown = first.messages + agent_conversation(6, blocks=4, output_chars=1500)[1:]
    compactor = Compactor(settings=FAST)
    compaction = await compactor.prepare(grown, window=window)
    assert any(is_summary_message(grown[i]) for i in compaction.plan.folded)
    second = await compaction.run(llm=llm, session_id=None)
    summary_request = llm.requests("summary")[-1]
    assert "ONE updated summary" in summary_request[0]["content"]
    body = summary_request[1]["content"]
    # The model updates its own text; the code-built ledger is carried forward by code.
    assert summary_text(first.summary_message).split("\n\n")[0] in body
    assert "## Ledger" not in body and "## Ledger" in second.summary_text
    assert SUMMARY_MARKER not in body
    assert sum(is_summary_message(m) for m in second.messages) == 1
    assert SUMMARY_MARKER not in llm.requests("memory")[-1][1]["content"]  # never mined again


async def test_compacting_the_output_again_changes_nothing(llm: ScriptedLLM) -> None:
    compactor = Compactor(settings=FAST)
    messages = agent_conversation(10, blocks=4, output_chars=1500)
    first, _, window = await _compact(messages, llm, compactor=compactor)
    again = await (await compactor.prepare(first.messages, window=window)).run(
        llm=llm, session_id=None
    )
    assert not compactor.needs_compaction(first.tokens_after, window)
    if again.path == "unchanged":
        assert again.messages is first.messages
    else:  # at most the summary is rewritten; everything else is the same objects
        assert again.messages[again.prefix_len :] == first.messages[again.keep_from :]
        assert sum(is_summary_message(m) for m in again.messages) == 1


async def test_identical_input_gives_a_byte_identical_summary_message() -> None:
    a, _, _ = await _compact(agent_conversation(8, blocks=4, output_chars=1500), ScriptedLLM())
    b, _, _ = await _compact(agent_conversation(8, blocks=4, output_chars=1500), ScriptedLLM())
    assert json.dumps(a.summary_message) == json.dumps(b.summary_message)
    c, _, _ = await _compact(agent_conversation(8, blocks=4, output_chars=1500), None)
    d, _, _ = await _compact(agent_conversation(8, blocks=4, output_chars=1500), None)
    assert json.dumps(c.summary_message) == json.dumps(d.summary_message)


# ---------------------------------------------------------------- never raises, never breaks


async def test_nothing_to_fold_is_unchanged(llm: ScriptedLLM) -> None:
    messages = simple_conversation(2)
    compactor = Compactor()
    compaction = await compactor.prepare(messages, window=100_000)
    result = await compaction.run(llm=llm, session_id=None)
    assert result.path == "unchanged" and result.messages is messages and llm.calls == []


async def test_an_internal_error_returns_the_input_with_the_reason() -> None:
    class BrokenEstimator:
        def __init__(self) -> None:
            self.calls = 0

        def count_text(self, text: str) -> int:
            raise ZeroDivisionError("estimator bug")

        def count_message(self, message: Any) -> int:
            return 100

        def count_tools(self, tools: Any) -> int:
            return 0

    messages = simple_conversation(20)
    compactor = Compactor(estimator=BrokenEstimator())
    plan = compactor.plan(messages, window=2000)
    result = await Compaction(compactor, messages, plan).run(llm=None, session_id=None)
    assert result.path == "unchanged" and result.messages is messages
    assert (
        result.reason == "internal error" and "ZeroDivisionError: estimator bug" in result.errors[0]
    )


async def test_a_bad_session_id_costs_the_flush_not_the_compaction(tmp_path: Path) -> None:
    compactor = Compactor(settings=FAST, memory=MemoryWriter(tmp_path))
    result, _, _ = await _compact(
        simple_conversation(20), None, compactor=compactor, session_id="../x"
    )
    assert result.path == "extractive" and any("memory flush failed" in e for e in result.errors)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(malformed=True), st.integers(300, 6000), st.booleans())
def test_any_conversation_compacts_into_a_valid_list(
    messages: list[Any], window: int, with_llm: bool
) -> None:
    compactor = Compactor(settings=FAST)
    compaction = asyncio.run(compactor.prepare(messages, window=window))
    plan = compaction.plan
    llm = ScriptedLLM() if with_llm else None
    result = asyncio.run(compaction.run(llm=llm, session_id=None))
    assert not result.errors or result.path != "unchanged" or result.reason != "internal error", (
        result.errors
    )
    if result.path == "unchanged":
        assert result.messages is messages
        return
    assert check_compacted(messages, result.messages, plan) == []
    before = len(check_tool_pairing(messages))
    assert len(check_tool_pairing(result.messages)) <= before
    assert result.tokens_after < result.tokens_before
    if result.fits:
        assert result.tokens_after <= plan.target_tokens


async def test_too_little_to_fold_is_decided_before_any_model_call() -> None:
    llm = ScriptedLLM()
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "x" * 4000},
    ]
    plan = Plan(
        head_end=1,
        keep_from=3,
        pinned=(),
        tokens_before=1020,
        target_tokens=600,
        summary_budget_tokens=300,
        fits=False,
    )
    result = await Compaction(Compactor(), messages, plan).run(llm=llm, session_id=None)
    assert result.path == "unchanged" and "too little" in result.reason
    assert result.messages is messages
    assert llm.calls == []


async def test_a_job_its_offload_lost_is_raised_not_logged_as_a_failed_compaction(
    llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    # The offload reported the loss (the proxy: one line per lost worker); the run says nothing
    # more, and its caller falls back as for any failure it was told of.
    compactor = Compactor(settings=FAST, offload=LosingOffload())
    messages = agent_conversation(8, blocks=4, output_chars=1500)
    compaction = await compactor.prepare(messages, window=_over(compactor, messages))
    with pytest.raises(OffloadLost):
        await compaction.run(llm=llm, session_id=None)
    assert caplog.records == []
