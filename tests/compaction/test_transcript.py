"""Transcript rendering: labels, clipping under pressure, user requests kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.corpus import read_corpus
from compaction import HeuristicEstimator, read_items
from compaction.messages import Item
from compaction.settings import TOOL_OUTPUT_CLIP_CHARS
from compaction.text import clip_middle
from compaction.tokens import CL100K
from compaction.transcript import _STAGES, _Entry, _entry, _limit, _Stages, render_transcript
from tests.factories import assistant, summary, tool_block, user

ESTIMATOR = HeuristicEstimator()


def test_transcript_labels_roles_and_shows_calls_with_arguments() -> None:
    block = tool_block(1, output="result text")
    messages = [user("please list"), *block, assistant("all done")]
    text = render_transcript(
        read_items(messages), range(len(messages)), estimator=ESTIMATOR, max_tokens=10_000
    )
    assert "[user]\nplease list" in text
    assert '→ bash({"command":"ls -la src/"})' in text
    assert "[tool result]\nresult text" in text
    assert "[assistant]\nall done" in text


def test_transcript_clips_tool_output_head_and_tail() -> None:
    output = "HEAD" + "x" * 10_000 + "TAIL"
    messages = [user("go"), *tool_block(1, output=output)]
    text = render_transcript(
        read_items(messages),
        range(len(messages)),
        estimator=ESTIMATOR,
        max_tokens=10_000,
        tool_output_clip_chars=300,
    )
    assert "HEAD" in text and "TAIL" in text and "chars omitted" in text
    assert len(text) < 1000


def test_transcript_under_pressure_keeps_every_user_request() -> None:
    messages = []
    for i in range(30):
        messages += [user(f"request number {i}: please do thing {i}")]
        messages += tool_block(2, output="noise " * 2000)
        messages += [assistant("thinking " * 400)]
    text = render_transcript(
        read_items(messages), range(len(messages)), estimator=ESTIMATOR, max_tokens=3000
    )
    assert ESTIMATOR.count_text(text) <= 3000
    for i in range(30):
        assert f"request number {i}: please do thing {i}" in text


def test_transcript_skips_earlier_summaries() -> None:
    messages = [summary("OLD"), user("new request")]
    text = render_transcript(read_items(messages), range(2), estimator=ESTIMATOR, max_tokens=1000)
    assert "OLD" not in text and "new request" in text


def test_mini_swe_observations_are_clipped_like_tool_output() -> None:
    observation = user("<returncode>0</returncode><output>" + "y" * 9000 + "</output>")
    messages = [user("fix the bug"), observation]
    text = render_transcript(
        read_items(messages),
        range(2),
        estimator=ESTIMATOR,
        max_tokens=10_000,
        tool_output_clip_chars=200,
    )
    assert "[command output]" in text and "chars omitted" in text


def _one_render_per_stage(
    items: list[Item], limit: int, estimator: HeuristicEstimator = ESTIMATOR
) -> str:
    """The transcript as it was built before stages reused unclipped renderings: every entry
    rendered again at every stage."""
    entries = [_entry(item) for item in items if item.kind != "summary"]
    for limits in [(TOOL_OUTPUT_CLIP_CHARS, None, None), *_STAGES[1:]]:
        text = "\n\n".join(e.render(limits) for e in entries)
        if estimator.count_text(text) <= limit:
            return text
    users = [e.render(_STAGES[-1]) for e in entries if e.kind == "user"]
    text = f"[… {len(entries) - len(users)} non-user messages omitted …]\n\n" + "\n\n".join(users)
    tokens = estimator.count_text(text)
    if tokens > limit:
        text = clip_middle(text, int(len(text) * limit / tokens * 0.95))
    return text


@pytest.mark.parametrize(
    "estimator",
    [ESTIMATOR, HeuristicEstimator(1.7, CL100K), HeuristicEstimator(0.55)],
    ids=["o200k", "cl100k-calibrated-up", "calibrated-down"],
)
def test_transcript_equals_one_render_per_stage_on_corpus_conversations(
    corpus_dir: Path, estimator: HeuristicEstimator
) -> None:
    """Stages skipped by their length bound, and renderings reused: the same text as before."""
    compared = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in list(read_corpus(path))[::4]:
            items = read_items(conversation["messages"])
            for limit in (500, 4_000, 24_000):
                expected = _one_render_per_stage(items, limit, estimator)
                found = render_transcript(
                    items, range(len(items)), estimator=estimator, max_tokens=limit
                )
                assert found == expected
                compared += 1
    assert compared > 100


def _shortest_entry_by_entry(
    entries: list[_Entry], limits: tuple[int, int | None, int | None]
) -> int:
    """The stage's length bound as a sum over its entries: each keeps its label and either its
    text without trailing spaces or, clipped, two thirds of the limit."""
    total = 2 * max(len(entries) - 1, 0)
    for entry in entries:
        limit = _limit(limits, entry.kind)
        clipped = limit is not None and len(entry.text) > limit
        kept = max(limit, 0) * 2 // 3 if clipped and limit is not None else len(entry.text.rstrip())
        total += len(entry.label) + 2 + kept
    return total


def test_the_length_bound_is_the_entry_by_entry_bound_and_holds_on_the_corpus(
    corpus_dir: Path,
) -> None:
    checked = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        for conversation in list(read_corpus(path))[::4]:
            entries = [
                _entry(i) for i in read_items(conversation["messages"]) if i.kind != "summary"
            ]
            stages = _Stages(entries)
            for limits in _STAGES:
                bound = stages.shortest(limits)
                assert bound == _shortest_entry_by_entry(entries, limits)
                assert bound <= len(stages.render(limits, stages.clipped(limits)))
                checked += 1
    assert checked > 100
