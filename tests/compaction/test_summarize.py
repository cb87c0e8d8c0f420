"""Prompts as package data, the summary and memory requests, and the framed summary message."""

from __future__ import annotations

from importlib import resources

import pytest

from compaction import SUMMARY_MARKER, HeuristicEstimator, is_summary_message
from compaction.composition import compose_summary
from compaction.ledger import Ledger
from compaction.summarize import (
    build_memory_request,
    build_summary_request,
    load_prompt,
    summary_message,
    summary_text,
    unwrap_summary,
)
from compaction.text import is_cjk_dominant
from tests.factories import CJK_SAMPLE, summary, user

ESTIMATOR = HeuristicEstimator()


def test_prompts_are_package_data_not_literals() -> None:
    folder = resources.files("compaction").joinpath("prompts")
    for name in ("summary", "update", "memory", "framing"):
        assert folder.joinpath(f"{name}.md").is_file()
        assert load_prompt(name).strip()
    assert "$summary" in load_prompt("framing")


def test_summary_prompt_asks_for_the_structured_sections_and_a_size() -> None:
    request = build_summary_request("T", previous_summary=None, max_tokens=777, cjk=False)
    system = request[0]["content"]
    for section in (
        "Goals and requests",
        "Decisions",
        "Facts",
        "Files touched",
        "Current state",
        "Open todos",
        "User preferences",
    ):
        assert section in system
    assert "777 tokens" in system
    assert "$" not in system


def test_cjk_conversation_is_told_to_the_summarizer() -> None:
    assert is_cjk_dominant([CJK_SAMPLE])
    assert not is_cjk_dominant(["plain English text", CJK_SAMPLE[:2]])
    cjk = build_summary_request("T", previous_summary=None, max_tokens=100, cjk=True)
    other = build_summary_request("T", previous_summary=None, max_tokens=100, cjk=False)
    assert "Chinese, Japanese or Korean" in cjk[0]["content"]
    assert "Chinese, Japanese or Korean" not in other[0]["content"]
    assert "Chinese, Japanese or Korean" in build_memory_request("T", cjk=True)[0]["content"]


def test_update_prompt_carries_the_previous_summary_text() -> None:
    request = build_summary_request(
        "new stuff", previous_summary="OLD BODY", max_tokens=100, cjk=False
    )
    assert "ONE updated summary" in request[0]["content"]
    assert "OLD BODY" in request[1]["content"] and "new stuff" in request[1]["content"]


def test_summary_message_is_framed_marked_and_byte_identical() -> None:
    first = summary_message("Facts: port 8080.")
    second = summary_message("Facts: port 8080.")
    assert first == second and first is not second
    assert first["role"] == "user"
    assert first["content"].startswith(SUMMARY_MARKER)
    assert is_summary_message(first)
    content = first["content"]
    assert (
        "latest user message" in content and "tools" in content and "no new instruction" in content
    )
    assert summary_text(first) == "Facts: port 8080."


def test_summary_text_of_a_foreign_framing_drops_only_the_marker() -> None:
    assert summary_text(summary("Goals: ship it.")) == "Goals: ship it."
    assert summary_text(user("hello")) == ""


@pytest.mark.parametrize(
    "reply",
    [
        "<summary>\nGoals: ship the parser.\n</summary>",
        "<analysis>thinking…</analysis>\n<summary>Goals: ship the parser.</summary>",
        "Here is the summary:\n<summary>Goals: ship the parser.</summary>\n",
    ],
)
def test_a_models_own_summary_wrapper_is_stripped_before_framing(reply: str) -> None:
    assert unwrap_summary(reply) == "Goals: ship the parser."
    body = compose_summary(
        reply, None, Ledger(), [], budget=500, folded_count=4, estimator=HeuristicEstimator()
    ).body
    framed = summary_message(body)["content"]
    assert framed.count("<summary>") == 1 and "thinking" not in framed
    assert body.startswith("Goals: ship the parser.")
