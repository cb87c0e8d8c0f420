"""The selective pass: old tool outputs reduced to previews, without a model call.

When a request reaches the trigger, the outputs of tool calls older than the recent tool loop are
cut to their head, their size and one line saying the whole was folded and is archived (the proxy
keeps folded originals verbatim; its `recall` tool returns them). Which ones, in order: successful
outputs before errors and failed tests (an agent reads those again), then the largest first, then
the oldest; until the request reaches the target, or none is left (whether that makes room
enough is for plan.preview_slack to say). Nothing else changes: the calls and their ids
(pairing, in every dialect), the assistant's turns with their reasoning blocks, the user's own
text, the head, and the last `RECENT_TOOL_BLOCKS` tool blocks stay as sent. A preview is a new
message (the caller's is never edited); a preview is never reduced again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from compaction.ledger import outcome_of
from compaction.marker import is_preview_text, preview_line
from compaction.messages import Item, Shape
from compaction.types import Message, Preview, Segments, TokenEstimator

RECENT_TOOL_BLOCKS = 5
"""The latest tool blocks (a call and its results) are the recent tool loop: never reduced."""

PREVIEW_HEAD_CHARS = 400
"""What a preview keeps of an output's head (what it is: the listing's first lines, the file's
opening)."""

PREVIEW_TAIL_CHARS = 200
"""And of its tail (how it ended: the test run's verdict, the error's last line)."""

MIN_OUTPUT_CHARS = 2000
"""Shorter outputs are left whole: their preview would save too little to be worth a change."""

_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b(?:Error|Exception|FAILED|FAIL:|failed|error:|"
    r"fatal:|panic:|Segmentation fault|exit code [1-9]|returncode>[1-9])",
)
"""What marks an output as an error or a failed test: kept longer than a successful listing."""


def preview_text(text: str) -> str:
    """`text` cut to its head and tail (at line ends where near), with what a summary's ledger
    keeps of it (exit status, error, failed tests, ids: `ledger.outcome_of`), its size, and the
    line that says where the rest went. A text under MIN_OUTPUT_CHARS comes back whole (a short
    result beside a long one in an Anthropic turn: its preview would be longer than itself)."""
    if len(text) < MIN_OUTPUT_CHARS:
        return text
    head = text[:PREVIEW_HEAD_CHARS]
    end = head.rfind("\n")
    if end > PREVIEW_HEAD_CHARS // 2:
        head = head[:end]
    tail = text[-PREVIEW_TAIL_CHARS:]
    start = tail.find("\n")
    if 0 <= start < PREVIEW_TAIL_CHARS // 2:
        tail = tail[start + 1 :]
    line = preview_line(outcome_of(text), len(text), text.count("\n") + 1)
    return f"{head}\n…\n{tail}\n{line}"


def is_error_output(text: str) -> bool:
    """True for an output that reads as an error or a failed test."""
    return _ERROR.search(text) is not None


def candidates(
    items: Sequence[Item], segments: Segments, *, recent_tool_blocks: int = RECENT_TOOL_BLOCKS
) -> list[int]:
    """The messages holding a tool output that may be reduced: in a tool block older than the
    recent tool loop, long enough, and not a preview already."""
    tool_blocks = [b for r in segments.rounds for b in r.blocks if b.kind == "tool"]
    old = tool_blocks[: max(0, len(tool_blocks) - recent_tool_blocks)]
    found: list[int] = []
    for block in old:
        for index in range(block.start, block.end):
            item = items[index]
            if item.kind != "tool" and not item.observation:
                continue
            if len(item.text) >= MIN_OUTPUT_CHARS and not is_preview_text(item.text):
                found.append(index)
    return found


def choose_previews(
    messages: Sequence[Message],
    items: Sequence[Item],
    counts: Sequence[int],
    segments: Segments,
    *,
    shape: Shape,
    estimator: TokenEstimator,
    target: int,
) -> tuple[tuple[Preview, ...], int]:
    """The previews that bring the request to `target` tokens, in priority order (successful
    outputs before errors, the largest first, the oldest first), and the request's estimate
    after them: over `target` when reducing every candidate is not enough."""
    order = sorted(
        candidates(items, segments),
        key=lambda i: (is_error_output(items[i].text), -counts[i], i),
    )
    total = segments.total_tokens
    chosen: list[Preview] = []
    for index in order:
        if total <= target:
            break
        reduced = shape.with_output(messages[index], preview_text)
        if reduced is None:
            continue
        saved = counts[index] - estimator.count_message(reduced)
        if saved <= 0:
            continue
        chosen.append((index, reduced))
        total -= saved
    chosen.sort(key=lambda preview: preview[0])
    return tuple(chosen), total


def apply_previews(messages: Sequence[Message], previews: Sequence[Preview]) -> list[Message]:
    """`messages` with each preview in its message's place; every other message the same
    object as given."""
    result = list(messages)
    for index, message in previews:
        result[index] = message
    return result
