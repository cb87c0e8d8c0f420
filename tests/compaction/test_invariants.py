"""The pairing rule and the compacted-list check, on hand-made breakage and generated plans."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from compaction.invariants import check_compacted, check_tool_pairing
from compaction.plan import plan_compaction
from compaction.segment import split
from compaction.tokens import HeuristicEstimator
from compaction.types import Plan
from tests import factories as f

EST = HeuristicEstimator()


def make_plan(head_end: int, keep_from: int, pinned: tuple[int, ...] = ()) -> Plan:
    return Plan(head_end, keep_from, pinned, 0, 0, 0, True)


def test_well_paired_parallel_calls_have_no_problem() -> None:
    messages = [f.system(), f.user(), *f.tool_block(3), f.assistant()]
    assert check_tool_pairing(messages) == []


def test_an_orphan_tool_result_is_reported() -> None:
    problems = check_tool_pairing([f.user(), f.tool_result("call_x")])
    assert len(problems) == 1 and "orphan" in problems[0] and "call_x" in problems[0]


def test_a_call_without_its_result_before_the_next_message_is_reported() -> None:
    call = f.tool_call("call_y")
    problems = check_tool_pairing([f.assistant_calls(call), f.assistant("moving on")])
    assert len(problems) == 1 and "unanswered" in problems[0]
    assert check_tool_pairing([f.assistant_calls(f.tool_call("call_z"))]) != []


def test_a_result_after_an_intervening_message_is_an_orphan() -> None:
    call = f.tool_call("call_w")
    messages = [f.assistant_calls(call), f.user("wait"), f.tool_result("call_w")]
    assert len(check_tool_pairing(messages)) == 2


def test_malformed_items_never_raise() -> None:
    assert len(check_tool_pairing(f.malformed_items())) == 2


def conversation() -> list[Any]:
    return [f.system(), *f.simple_round(0), f.user("task"), *f.tool_block(2), *f.simple_round(1)]


def test_a_faithful_compaction_passes() -> None:
    messages = conversation()
    plan = make_plan(1, 7, pinned=(3,))
    assert check_compacted(messages, f.apply_plan(messages, plan), plan) == []


def test_a_copied_kept_message_is_caught() -> None:
    messages = conversation()
    plan = make_plan(1, 7)
    compacted = f.apply_plan(messages, plan)
    compacted[-1] = dict(compacted[-1])
    assert any("not the original object" in p for p in check_compacted(messages, compacted, plan))


def test_an_edited_head_is_caught() -> None:
    messages = conversation()
    plan = make_plan(1, 7)
    compacted = f.apply_plan(messages, plan)
    compacted[0] = f.system("changed")
    assert any(p.startswith("head") for p in check_compacted(messages, compacted, plan))


def test_a_missing_summary_is_caught() -> None:
    messages = conversation()
    plan = make_plan(1, 7)
    compacted = f.apply_plan(messages, plan)
    compacted[1] = f.user("not a summary")
    assert any("summary" in p for p in check_compacted(messages, compacted, plan))


def test_a_wrong_length_is_caught() -> None:
    messages = conversation()
    plan = make_plan(1, 7)
    assert check_compacted(messages, f.apply_plan(messages, plan)[:-1], plan) != []


def test_a_cut_through_a_tool_block_is_caught_as_a_new_problem() -> None:
    messages = conversation()  # the tool block is messages[4:7]
    plan = make_plan(1, 5, pinned=(3,))
    problems = check_compacted(messages, f.apply_plan(messages, plan), plan)
    assert any("new pairing problem" in p for p in problems)


def test_pre_existing_orphans_may_remain() -> None:
    messages = [f.system(), *f.simple_round(0), f.user(), f.tool_result("orphan"), f.assistant()]
    plan = make_plan(1, 4, pinned=(3,))
    assert check_compacted(messages, f.apply_plan(messages, plan), plan) == []


def test_an_unchanged_plan_expects_the_same_objects() -> None:
    messages = conversation()
    plan = make_plan(1, 1)
    assert check_compacted(messages, list(messages), plan) == []
    assert check_compacted(messages, [dict(m) for m in messages], plan) != []


@given(f.conversations(malformed=True))
def test_planned_compactions_never_add_pairing_problems(messages: list[Any]) -> None:
    plan = plan_compaction(split(messages, EST), window=2_000, summary_budget_tokens=100)
    assert check_compacted(messages, f.apply_plan(messages, plan), plan) == []
