"""What the library leaves where the client put it: a provider's sealed compaction (Responses
`compaction` items, Anthropic `compaction` blocks) and the context a client injects.

- A sealed compaction carries what the provider already compacted; only the provider can read
  it. It is never folded, dropped, moved or re-encoded: it and everything before it stay as
  sent (the head), and only what follows is folded. OpenAI: "The returned compaction item
  carries forward key prior state ... It is opaque" (developers.openai.com/api/docs/guides/
  compaction); Anthropic: "Put the block first in `messages` ... Send exactly one `compaction`
  block per request" (platform.claude.com/docs/en/build-with-claude/compaction-on-demand).
- It costs what the upstream charges for it: the summary it seals, not its ciphertext as text.
- After a fold, the latest turn of each kind of injected context (Codex's
  `<environment_context>`, `<user_instructions>`...; Claude Code's `<system-reminder>`) still
  reaches the model, verbatim.
"""

from __future__ import annotations

import base64
import random
from typing import Any

from compaction import CompactionSettings, Compactor, is_summary_message
from compaction.messages import ANTHROPIC, MESSAGE_OVERHEAD_TOKENS, RESPONSES, read_items
from compaction.plan import plan_compaction
from compaction.segment import split
from compaction.tokens import HeuristicEstimator
from tests import factories as f
from tests.compaction.conftest import ScriptedLLM

RESPONSES_EST = HeuristicEstimator(shape=RESPONSES)
ANTHROPIC_EST = HeuristicEstimator(shape=ANTHROPIC)
FAST = CompactionSettings(llm_timeout_s=0.2)


def ciphertext(size: int) -> str:
    """Base64 of `size` random bytes, like a provider's sealed payload."""
    return base64.b64encode(random.Random(size).randbytes(size)).decode()


def compaction_item(size: int = 6_000) -> dict[str, Any]:
    return {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA" + ciphertext(size)}


def responses_message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def responses_rounds(start: int, count: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(start, start + count):
        call_id = f"call_{i}"
        items += [
            responses_message("user", f"Task {i}: edit src/module_{i}.py and run the tests"),
            {"type": "function_call", "call_id": call_id, "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": "ok " * 120},
            responses_message("assistant", f"Finished task {i}."),
        ]
    return items


def environment(cwd: str) -> dict[str, Any]:
    text = (
        f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n</environment_context>"
    )
    return responses_message("user", text)


def anthropic_compaction_turn() -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {
                "type": "compaction",
                "content": "Summary of the conversation: the user is building a recipe app.",
                "signature": "EuYBCkQY" + ciphertext(3_000),
            }
        ],
    }


def anthropic_rounds(count: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i in range(count):
        call_id = f"toolu_{i}"
        turns += [
            {"role": "user", "content": f"Task {i}: edit src/module_{i}.py"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call_id, "name": "bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call_id, "content": "ok " * 120}
                ],
            },
            {"role": "assistant", "content": f"Finished task {i}."},
        ]
    return turns


# ----------------------------------------------------------------------- sealed compactions


def test_a_responses_compaction_item_ends_the_head() -> None:
    items = [
        responses_message("developer", "Be careful."),
        responses_message("user", "An earlier request Codex kept."),
        compaction_item(),
        *responses_rounds(0, 6),
    ]
    segments = split(items, RESPONSES_EST, shape=RESPONSES)
    assert segments.head_end == 3
    assert read_items(items, RESPONSES)[2].sealed


def test_the_latest_sealed_compaction_ends_the_head() -> None:
    items = [compaction_item(), *responses_rounds(0, 2), compaction_item(7_000)]
    items += responses_rounds(2, 4)
    assert split(items, RESPONSES_EST, shape=RESPONSES).head_end == 10


def test_reasoning_keeps_folding_although_it_is_sealed_too() -> None:
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": ciphertext(900)}
    items = [responses_message("user", "Go."), reasoning, *responses_rounds(0, 3)]
    assert not read_items(items, RESPONSES)[1].sealed
    assert split(items, RESPONSES_EST, shape=RESPONSES).head_end == 0


def test_a_conversation_led_by_an_anthropic_compaction_block_keeps_it_as_its_head() -> None:
    turns = [anthropic_compaction_turn(), *anthropic_rounds(6)]
    segments = split(turns, ANTHROPIC_EST, shape=ANTHROPIC)
    assert segments.head_end == 1


def test_a_compaction_item_costs_the_summary_it_seals_not_its_ciphertext_as_text() -> None:
    # Codex's own estimate (codex-rs context_manager/history.rs, estimate_reasoning_length):
    # the base64 decoded (3/4 of its length) less ~650 bytes of envelope, at 4 bytes a token.
    item = compaction_item(60_000)
    content = item["encrypted_content"]
    expected = (len(content) * 3 / 4 - 650) / 4
    cost = RESPONSES_EST.count_message(item) - MESSAGE_OVERHEAD_TOKENS
    assert abs(cost - expected) <= 2
    assert cost < RESPONSES_EST.count_text(content)


def test_an_anthropic_compaction_block_costs_its_readable_summary_not_its_signature() -> None:
    turn = anthropic_compaction_turn()
    summary = turn["content"][0]["content"]
    cost = ANTHROPIC_EST.count_message(turn) - MESSAGE_OVERHEAD_TOKENS
    assert cost == ANTHROPIC_EST.count_text(summary)


async def test_only_what_follows_a_compaction_item_is_folded() -> None:
    head = [responses_message("developer", "Be careful."), compaction_item()]
    items = [*head, *responses_rounds(0, 30)]
    compactor = Compactor(settings=FAST)
    window = int(compactor.estimate(items, estimator=RESPONSES_EST) / 0.9)
    compaction = await compactor.prepare(items, window=window, estimator=RESPONSES_EST)
    result = await compaction.run(llm=ScriptedLLM(), session_id=None)
    assert result.path == "llm"
    out = result.messages
    assert out[0] is items[0] and out[1] is items[1]
    assert is_summary_message(out[2], RESPONSES)


# ----------------------------------------------------------------------- injected context


def test_the_latest_environment_context_is_pinned_when_it_would_be_folded() -> None:
    old, new = environment("/repo"), environment("/repo/sub")
    items = [
        responses_message("developer", "Be careful."),
        old,
        *responses_rounds(0, 10),
        new,
        *responses_rounds(10, 20),
    ]
    segments = split(items, RESPONSES_EST, shape=RESPONSES)
    window = int(segments.total_tokens / 0.9)
    plan = plan_compaction(segments, window=window, keep_recent_rounds=2)
    latest = items.index(new)
    assert plan.head_end < latest < plan.keep_from
    assert latest in plan.pinned
    assert items.index(old) not in plan.pinned


def test_each_kind_of_injected_context_keeps_its_latest_turn() -> None:
    instructions = responses_message(
        "user", "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\nUse tabs.\n</INSTRUCTIONS>"
    )
    env = environment("/repo")
    items = [responses_message("developer", "Be careful."), instructions, env]
    items += responses_rounds(0, 30)
    segments = split(items, RESPONSES_EST, shape=RESPONSES)
    plan = plan_compaction(segments, window=int(segments.total_tokens / 0.9))
    assert {1, 2} <= set(plan.pinned)


def test_context_already_in_the_kept_part_is_not_pinned_again() -> None:
    env = environment("/repo")
    items = [responses_message("developer", "Be careful."), environment("/old")]
    items += [*responses_rounds(0, 60), env, *responses_rounds(60, 3)]
    segments = split(items, RESPONSES_EST, shape=RESPONSES)
    plan = plan_compaction(segments, window=int(segments.total_tokens / 0.9))
    assert plan.keep_from <= items.index(env)
    assert 1 not in plan.pinned


async def test_a_compacted_chat_history_still_carries_its_latest_injected_context() -> None:
    reminder = f.user("<system-reminder>\nThe date is 2026-12-07.\n</system-reminder>")
    messages = [f.system(), reminder, *f.agent_conversation(12)[1:]]
    compactor = Compactor(settings=FAST)
    window = int(compactor.estimate(messages) / 0.9)
    compaction = await compactor.prepare(messages, window=window)
    result = await compaction.run(llm=ScriptedLLM(), session_id=None)
    assert result.path == "llm"
    assert any(m is reminder for m in result.messages)
