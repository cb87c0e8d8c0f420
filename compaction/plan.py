"""Decide when to compact and where to cut: pure arithmetic over Segments.

The compacted request is head + summary + pinned + kept tail (see types.Plan). Its target is
`target_ratio` of the window, well below the trigger so the next turns do not compact again, and
never more than the window minus the requested output. Cuts fall only on block boundaries: the
last `keep_recent_rounds` rounds are kept when they fit, fewer when they do not, and a single
round too big on its own is cut inside, keeping its user message pinned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compaction.settings import KEEP_RECENT_ROUNDS, SUMMARY_MAX_TOKENS, TARGET_RATIO, TRIGGER_RATIO
from compaction.tokens import REPLY_PRIMING_TOKENS
from compaction.types import Block, Plan, Round, Segments


def should_compact(
    tokens: int,
    window: int,
    *,
    trigger_ratio: float = TRIGGER_RATIO,
    max_output_tokens: int | None = None,
) -> bool:
    """True at `trigger_ratio` of the window, or when prompt plus requested output overflows."""
    if tokens >= trigger_ratio * window:
        return True
    return max_output_tokens is not None and tokens + max_output_tokens > window


def target_tokens(window: int, target_ratio: float, max_output_tokens: int | None) -> int:
    """The prompt size to aim for: `target_ratio` of the window, and room for the output.

    A caller asking for a large `max_tokens` needs the prompt to leave that much of the window
    free, whatever the ratio says; the smaller of the two limits wins.
    """
    target = int(target_ratio * window)
    if max_output_tokens is not None:
        target = min(target, window - max_output_tokens)
    return max(target, 0)


@dataclass(frozen=True)
class _Budget:
    """What the compacted request costs besides the kept messages."""

    fixed: int  # head + tools + reply priming
    summary: int
    target: int

    def fits(self, kept: int) -> bool:
        return self.fixed + self.summary + kept <= self.target


def plan_compaction(
    segments: Segments,
    *,
    window: int,
    target_ratio: float = TARGET_RATIO,
    keep_recent_rounds: int = KEEP_RECENT_ROUNDS,
    summary_budget_tokens: int = SUMMARY_MAX_TOKENS,
    max_output_tokens: int | None = None,
) -> Plan:
    """Where to cut `segments` so that head + summary + kept part reaches the target.

    Deterministic and pure. A plan with keep_from == head_end folds nothing ("unchanged");
    `fits` is False (with a note) when even the smallest keepable part misses the target.
    """
    target = target_tokens(window, target_ratio, max_output_tokens)
    budget = _Budget(
        segments.head_tokens + segments.tools_tokens + REPLY_PRIMING_TOKENS,
        summary_budget_tokens,
        target,
    )
    user_rounds = [r for r in segments.rounds if r.has_user]
    if segments.total_tokens <= target and len(user_rounds) <= keep_recent_rounds:
        return _unchanged(segments, budget, "under target with few rounds")
    kept = _kept_rounds(user_rounds, keep_recent_rounds, budget)
    if kept:
        return _plan(segments, budget, kept[0].start, ())
    if not segments.rounds:
        return _unchanged(segments, budget, "nothing after the head to fold")
    return _cut_inside(segments, segments.rounds[-1], budget)


def _kept_rounds(user_rounds: Sequence[Round], keep: int, budget: _Budget) -> list[Round]:
    """The most recent rounds (at most `keep`) that fit the budget together."""
    kept: list[Round] = []
    tokens = 0
    for round_ in reversed(user_rounds[len(user_rounds) - keep :] if keep > 0 else []):
        if not budget.fits(tokens + round_.tokens):
            break
        kept.insert(0, round_)
        tokens += round_.tokens
    return kept


def _cut_inside(segments: Segments, last: Round, budget: _Budget) -> Plan:
    """Keep the latest blocks of the last round that fit, pinning its user message."""
    pinned = (last.start,) if last.has_user else ()
    movable = last.blocks[1:] if last.has_user else last.blocks
    pin_tokens = last.blocks[0].tokens if last.has_user else 0
    first = _first_fitting_block(movable, pin_tokens, budget)
    if first is None:
        first = movable[-1] if movable else last.blocks[0]
        if first.start == last.start:
            pinned = ()
        return _plan(
            segments, budget, first.start, pinned, "the latest block alone exceeds the target"
        )
    return _plan(segments, budget, first.start, pinned)


def _first_fitting_block(blocks: Sequence[Block], extra: int, budget: _Budget) -> Block | None:
    """The earliest block such that it and all after it (plus `extra`) fit the budget."""
    tokens = extra
    first: Block | None = None
    for block in reversed(blocks):
        tokens += block.tokens
        if not budget.fits(tokens):
            break
        first = block
    return first


def _plan(
    segments: Segments, budget: _Budget, keep_from: int, pinned: tuple[int, ...], note: str = ""
) -> Plan:
    if keep_from <= segments.head_end:
        return _unchanged(segments, budget, note or "nothing before the kept part to fold")
    kept = sum(b.tokens for r in segments.rounds for b in r.blocks if b.start >= keep_from)
    kept += sum(_block_at(segments, i).tokens for i in pinned)
    return Plan(
        head_end=segments.head_end,
        keep_from=keep_from,
        pinned=pinned,
        tokens_before=segments.total_tokens,
        target_tokens=budget.target,
        summary_budget_tokens=budget.summary,
        fits=budget.fits(kept),
        note=note,
    )


def _unchanged(segments: Segments, budget: _Budget, note: str) -> Plan:
    fits = segments.total_tokens <= budget.target
    return Plan(
        head_end=segments.head_end,
        keep_from=segments.head_end,
        pinned=(),
        tokens_before=segments.total_tokens,
        target_tokens=budget.target,
        summary_budget_tokens=budget.summary,
        fits=fits,
        note=note,
    )


def _block_at(segments: Segments, index: int) -> Block:
    for round_ in segments.rounds:
        for block in round_.blocks:
            if block.start == index:
                return block
    raise ValueError(f"no block starts at message {index}")
