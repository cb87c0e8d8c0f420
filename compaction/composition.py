"""The summary body: the model's text or an extractive lead, the ledger, and missing key items.

Everything is fitted under a token budget: the model's text (or, without it, the previous summary)
takes at most LLM_SHARE, the ledger most of the rest, and key items the summary does not mention
are appended while they fit. Ledger entries with no room go back as overflow for the memory file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compaction.ledger import Ledger, render_ledger
from compaction.text import clip_middle
from compaction.types import MemoryItem, ResultPath, TokenEstimator
from compaction.verify import append_missing, missing_items

LLM_SHARE = 0.65
"""Of the summary body, the part the model's text may take; the ledger gets the rest."""

MIN_BODY_TOKENS = 200
"""A summary may take half of what it replaces, but never needs to be smaller than this."""


def is_too_little(folded_tokens: int, framing_tokens: int) -> bool:
    """True when the folded messages are no bigger than the smallest summary replacing them."""
    return folded_tokens <= framing_tokens + MIN_BODY_TOKENS


def body_budget(summary_budget: int, framing_tokens: int, replaced_tokens: int) -> int:
    """Tokens for the summary body: the plan's budget minus the framing, and at most half of
    what it replaces (but never below MIN_BODY_TOKENS), so a compaction always shrinks."""
    return min(summary_budget - framing_tokens, max(MIN_BODY_TOKENS, replaced_tokens // 2))


@dataclass(frozen=True)
class Composed:
    body: str
    path: ResultPath
    overflow: Ledger


def compose_summary(
    reply_text: str | None,
    previous_summary: str | None,
    ledger: Ledger,
    items: Sequence[MemoryItem],
    *,
    budget: int,
    folded_count: int,
    estimator: TokenEstimator,
) -> Composed:
    """The summary body within `budget` tokens: "llm" with a model text, else "extractive", and
    "dropped" (a one-line note) when not even the lead fits."""
    fits = _fits(estimator, budget)
    path: ResultPath = "llm" if reply_text is not None else "extractive"
    if reply_text is not None:
        lead = clip_to_tokens(reply_text.strip(), int(budget * LLM_SHARE), estimator)
    else:
        lead = _extractive_lead(previous_summary, folded_count, budget, estimator)
    if not lead or not fits(lead):
        note = f"{folded_count} earlier messages were omitted to fit the context window."
        return Composed(note, "dropped", ledger)
    reserve = min(int(budget * 0.15), sum(estimator.count_text(i.content) + 4 for i in items))
    ledger_budget = budget - estimator.count_text(lead) - reserve - 2
    ledger_text, overflow = render_ledger(ledger, estimator=estimator, max_tokens=ledger_budget)
    body = f"{lead}\n\n{ledger_text}" if ledger_text else lead
    body = append_missing(body, missing_items(items, body), fits=fits)
    return Composed(body, path, overflow)


def _fits(estimator: TokenEstimator, budget: int) -> Callable[[str], bool]:
    return lambda text: estimator.count_text(text) <= budget


def _extractive_lead(
    previous_summary: str | None, folded_count: int, budget: int, estimator: TokenEstimator
) -> str:
    lead = f"(Built without the model from {folded_count} condensed messages.)"
    if previous_summary:
        earlier = clip_to_tokens(previous_summary, int(budget * 0.4), estimator)
        lead = f"{lead}\n\n## Earlier summary\n{earlier}"
    return lead


def clip_to_tokens(text: str, max_tokens: int, estimator: TokenEstimator) -> str:
    """`text` cut in the middle until it fits `max_tokens` (an estimate, so twice at most)."""
    for _ in range(3):
        tokens = estimator.count_text(text)
        if tokens <= max_tokens:
            return text
        text = clip_middle(text, max(0, int(len(text) * max_tokens / tokens * 0.9)))
    return text if estimator.count_text(text) <= max_tokens else ""
