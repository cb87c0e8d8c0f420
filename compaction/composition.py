"""The summary body: the user's standing instructions, the model's text or the fallback's note,
the task, the ledger, key items.

Everything is fitted under a token budget. The model's text is an addition, never a replacement:
the code-built sections (sections.py) are always there, and an earlier summary's sections are
read back and carried forward, so an update by a forgetful model keeps what code collected, and
a fallback merges the earlier summary's entries instead of wrapping the earlier summary (summaries
never nest). The standing instructions have a budget of their own (`pinned_budget`) and are
composed by code whatever the model wrote, so a model that drops them drops nothing. What has no
room is returned for the memory file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from compaction.instructions import Instruction, merge_instructions
from compaction.ledger import Ledger, overflow_items
from compaction.messages import Item, Shape
from compaction.pinned import Pinned, render_pinned
from compaction.sections import Body, read_body, render_sections, render_task
from compaction.summarize import summary_text, unwrap_summary
from compaction.text import clip_middle, collapse_spaces
from compaction.types import MemoryItem, Message, ResultPath, TokenEstimator

LLM_SHARE = 0.45
"""Of the summary body, the part the model's text may take; the code-built sections get the rest
and whatever the model leaves unused."""

TASK_SHARE = 0.4
"""Of the summary body, the most a quoted task may take (clipped head and tail)."""

CARRIED_SHARE = 0.25
"""Of a fallback body, the most an earlier model text may take."""

MIN_BODY_TOKENS = 200
"""A summary may take half of what it replaces, but never needs to be smaller than this."""

_FALLBACK_NOTE = re.compile(r"^\(Built without the model from \d+ condensed messages\.\)\s*")


def is_too_little(folded_tokens: int, framing_tokens: int) -> bool:
    """True when the folded messages are no bigger than the smallest summary replacing them."""
    return folded_tokens <= framing_tokens + MIN_BODY_TOKENS


def body_budget(summary_budget: int, framing_tokens: int, replaced_tokens: int) -> int:
    """Tokens for the summary body: the plan's budget minus the framing, and at most half of
    what it replaces (but never below MIN_BODY_TOKENS), so a compaction always shrinks."""
    return min(summary_budget - framing_tokens, max(MIN_BODY_TOKENS, replaced_tokens // 2))


def read_previous(
    messages: Sequence[Message], items: Sequence[Item], folded: Sequence[int], shape: Shape
) -> tuple[str, Body | None]:
    """The earlier summaries in the folded span: their text, and their body read back (the lead
    without a fallback's note, so that a fallback of a fallback never repeats it)."""
    text = "\n\n".join(
        t for i in folded if items[i].kind == "summary" and (t := summary_text(messages[i], shape))
    )
    if not text:
        return "", None
    body = read_body(text)
    lead = _FALLBACK_NOTE.sub("", body.lead).strip()
    return text, Body(
        lead, body.task, body.ledger, body.items, body.instructions, body.pinned_overflow
    )


@dataclass(frozen=True)
class Composed:
    body: str
    path: ResultPath
    overflow: Ledger
    left_out: tuple[MemoryItem, ...]
    """Key items with no room in the body (they go to the memory file)."""
    pinned_left_out: tuple[Instruction, ...] = ()
    """Standing instructions with no room in their section (they go to the memory file)."""

    def memory_items(self, found: Sequence[MemoryItem]) -> tuple[MemoryItem, ...]:
        """What the memory file gets: the items found, and whatever had no room here."""
        pinned = Pinned("", self.pinned_left_out, 0).memory_items()
        return tuple(
            dict.fromkeys([*pinned, *found, *self.left_out, *overflow_items(self.overflow)])
        )


def compose_summary(
    reply_text: str | None,
    previous: Body | None,
    ledger: Ledger,
    items: Sequence[MemoryItem],
    *,
    quoted: Sequence[str] = (),
    budget: int,
    folded_count: int,
    estimator: TokenEstimator,
    pinned_budget: int = 0,
) -> Composed:
    """The summary body within `budget` tokens, plus the standing instructions within
    `pinned_budget`: "llm" with a model text, else "extractive", and "dropped" (a one-line note
    after the instructions) when not even the lead fits."""
    pinned = compose_pinned(
        previous, ledger.instructions, budget=pinned_budget, estimator=estimator
    )
    if pinned.shown:  # a request the section quotes whole is not listed twice
        quoted_whole = {i.text for i in pinned.shown}
        ledger = replace(
            ledger, requests=tuple(r for r in ledger.requests if r not in quoted_whole)
        )
    if previous is not None:
        ledger = previous.ledger.merged(ledger)
        items = [*previous.items, *(i for i in items if i not in previous.items)]
    path: ResultPath = "llm" if reply_text is not None else "extractive"
    if reply_text is not None:
        lead = clip_to_tokens(unwrap_summary(reply_text), int(budget * LLM_SHARE), estimator)
    else:
        lead = f"(Built without the model from {folded_count} condensed messages.)"
        if previous is not None and previous.lead:
            carried = clip_to_tokens(previous.lead, int(budget * CARRIED_SHARE), estimator)
            lead = f"{lead}\n\n{carried}" if carried else lead
    task = previous.task if previous is not None and previous.task else None
    if quoted:
        task = "\n\n".join([*([task] if task else []), *quoted])
    task_text = ""
    if task:
        clipped = clip_to_tokens(task, int(budget * TASK_SHARE), estimator)
        task_text = render_task(clipped) if clipped else ""
    if task_text and ledger.requests:  # the task, quoted whole, is not listed a second time
        shown = collapse_spaces(task_text)
        ledger = replace(ledger, requests=tuple(r for r in ledger.requests if r not in shown))
    parts = [p for p in (lead, task_text) if p]
    head = "\n\n".join(parts)
    if not lead or estimator.count_text(head) > budget:
        note = f"{folded_count} earlier messages were omitted to fit the context window."
        return Composed(
            _joined(pinned.text, note), "dropped", ledger, tuple(items), pinned.left_out
        )
    room = budget - estimator.count_text(head) - 2
    rendered = render_sections(ledger, tuple(items), estimator=estimator, max_tokens=room)
    body = _joined(pinned.text, head, rendered.text)
    return Composed(body, path, rendered.overflow, rendered.left_out, pinned.left_out)


def compose_pinned(
    previous: Body | None,
    found: Sequence[Instruction],
    *,
    budget: int,
    estimator: TokenEstimator,
) -> Pinned:
    """The pinned section of a new summary: the earlier summary's standing instructions carried
    forward, then those `found` in the folded turns, within `budget` tokens (the earlier
    overflow still counted)."""
    return render_pinned(
        merge_instructions(previous.instructions if previous else (), found),
        budget=budget,
        estimator=estimator,
        earlier_overflow=previous.pinned_overflow if previous else 0,
    )


def _joined(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)


def clip_to_tokens(text: str, max_tokens: int, estimator: TokenEstimator) -> str:
    """`text` cut in the middle until it fits `max_tokens` (an estimate, so twice at most)."""
    for _ in range(3):
        tokens = estimator.count_text(text)
        if tokens <= max_tokens:
            return text
        text = clip_middle(text, max(0, int(len(text) * max_tokens / tokens * 0.9)))
    return text if estimator.count_text(text) <= max_tokens else ""
