"""One checkpoint layout (compaction.Layout) read four ways: applied, estimated, spliced and
said to have folded. Each is proved equal to its former definition (written out here) over
generated checkpoints: a summary alone, previews alone, both, pinned messages, extensions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction import CHAT, Checkpoint, HeuristicEstimator, Message, View
from proxy.compacting.decision.history import ListHistory, raw_tokens
from proxy.compacting.decision.records import folded_range
from proxy.compacting.fast.parts import splice
from proxy.compacting.fast.spans import locate_value, scan_items

EST = HeuristicEstimator(shape=CHAT)


def _message(i: int) -> Message:
    return {"role": "user" if i % 3 == 0 else "assistant", "content": f"message {i} " * (i % 7)}


@st.composite
def checkpoints(draw: st.DrawFn) -> tuple[Checkpoint, int]:
    """A checkpoint and the length of a list it applies to."""
    count = draw(st.integers(2, 30))
    cut = draw(st.integers(1, count))
    head_end = draw(st.integers(0, cut - 1))
    summary = draw(st.booleans())
    previewed = sorted(draw(st.sets(st.integers(head_end, cut - 1), max_size=5)))
    if not summary and not previewed:
        summary = True
    if summary:
        resume = draw(st.integers(head_end, cut)) if previewed else None
        if previewed and resume is not None:
            previewed = [i for i in previewed if i >= resume]
        if not previewed:
            resume = None
        start = cut if resume is None else resume
        pinned = []
        if start > head_end:
            pinned = sorted(draw(st.sets(st.integers(head_end, start - 1), max_size=3)))
    else:
        resume = head_end = previewed[0]
        pinned = []
    previews = tuple((i, {"role": "tool", "content": f"preview of {i}"}) for i in previewed)
    checkpoint = Checkpoint(
        key=b"k" * 16,
        cut=cut,
        head_end=head_end,
        pinned=tuple(pinned),
        summary_message={"role": "user", "content": "summary"} if summary else None,
        compaction_id="c",
        path="llm",
        previews=previews,
        resume=resume,
    )
    return checkpoint, count


def former_apply(checkpoint: Checkpoint, messages: Sequence[Message]) -> list[Message]:
    """Checkpoint.apply before the layout."""
    summary = checkpoint.summary_message
    view = [*messages[: checkpoint.head_end]]
    if summary is not None:
        view.append(summary)
    view += (messages[i] for i in checkpoint.pinned)
    start = checkpoint.run_start
    for index, preview in checkpoint.previews:
        view += messages[start:index]
        view.append(preview)
        start = index + 1
    view += messages[start:]
    return view


def former_raw_tokens(history: ListHistory, base: Checkpoint) -> int:
    """proxy.compacting.decision.history.raw_tokens before the layout."""
    total = history.tokens_to(len(history))

    def one(i: int) -> int:
        return history.tokens_to(i + 1) - history.tokens_to(i)

    pinned = sum(one(i) for i in base.pinned)
    summary = base.summary_message
    summary_tokens = 0 if summary is None else EST.count_message(summary)
    run = history.tokens_to(base.cut) - history.tokens_to(base.run_start)
    if base.previews:
        run += base.preview_tokens(CHAT) - sum(one(i) for i, _ in base.previews)
    kept = total - history.tokens_to(base.cut)
    return history.tokens_to(base.head_end) + summary_tokens + pinned + run + kept


def former_folded_range(view: View, checkpoint: Checkpoint) -> list[int]:
    """proxy.compacting.decision.records.folded_range before the layout."""
    base = view.base
    start = base.cut if base is not None else checkpoint.head_end
    if checkpoint.previews:
        before = {i for i, _ in base.previews} if base is not None else set()
        start = min([start, *(i for i, _ in checkpoint.previews if i not in before)])
    return [start, checkpoint.cut]


def spliced(messages: list[Message], checkpoint: Checkpoint) -> Any:
    """The body the fast path splices from the layout's parts, parsed back."""
    body = orjson.dumps({"messages": messages})
    open_at = locate_value(body, b'"messages"')
    assert open_at is not None
    items = scan_items(body, open_at)
    assert items is not None
    parts = [
        part if isinstance(part, (int, range)) else orjson.dumps(part)
        for part in checkpoint.layout.parts_of(len(messages))
    ]
    return orjson.loads(splice(body, open_at, items, parts))["messages"]


@settings(max_examples=300, deadline=None)
@given(checkpoints(), checkpoints())
def test_the_layout_is_the_view_every_reader_read_before(
    drawn: tuple[Checkpoint, int], other: tuple[Checkpoint, int]
) -> None:
    checkpoint, count = drawn
    messages = [_message(i) for i in range(count)]
    view = checkpoint.apply(messages)
    assert view == former_apply(checkpoint, messages)
    assert spliced(messages, checkpoint) == view
    history = ListHistory(messages, b"seed", CHAT)
    assert raw_tokens(history, checkpoint, CHAT) == former_raw_tokens(history, checkpoint)
    assert raw_tokens(history, checkpoint, CHAT) == sum(EST.count_messages(view))
    # What it folded, over the original list and over the view of another checkpoint.
    for base in (None, other[0] if other[0].cut <= count else None):
        seen = View.of(messages, base)
        assert folded_range(seen, checkpoint) == former_folded_range(seen, checkpoint)
