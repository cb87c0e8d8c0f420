"""Decide when to compact and where to cut: pure arithmetic over Segments.

The compacted request is head + summary + pinned + kept tail (see types.Plan). Its target is
`target_ratio` of the window, well below the trigger so the next turns do not compact again; when
the requested output brings the trigger closer, the target comes down with it in proportion.
Cuts fall only on block boundaries: as many recent blocks are kept as fit the target (at least
the last `keep_recent_rounds` rounds when they fit), and a round cut inside keeps its user
message pinned, as does the conversation's task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, takewhile

from compaction.settings import KEEP_RECENT_ROUNDS, SUMMARY_MAX_TOKENS, TARGET_RATIO, TRIGGER_RATIO
from compaction.tokens import REPLY_PRIMING_TOKENS
from compaction.types import Block, Plan, Round, Segments

FIT_MARGIN_RATIO = 0.01
"""The share of the window kept free below where a request stops fitting (prompt plus its
`max_tokens`), for the estimate's error: Claude Code at a 200k window asking 128k, a request the
estimate put at 71.6k the upstream counted at 72.1k and refused."""


def room_for_prompt(window: int, max_output_tokens: int) -> int:
    """The largest prompt estimate that still fits `window` with `max_output_tokens` of output,
    the margin kept."""
    return window - max_output_tokens - math.ceil(FIT_MARGIN_RATIO * window)


@dataclass(frozen=True)
class Trigger:
    """When a request is compacted, the one rule: its estimate reaches `ratio` of its window or
    `tokens` (an absolute trigger; None: the ratio alone), whichever comes first, or the prompt
    plus the output it asks for (`max_tokens`) no longer fits the window.

    An absolute trigger far below the ratio's (200k on a 1M window: the ratio says 850k) moves
    every other share with it: the target, the room for previews, the standing instructions, the
    summary's share and preparing ahead are shares of `effective_window`, the window whose
    `ratio` the absolute trigger is, so a request after a compaction sits as far below an
    absolute trigger as it would below the ratio's. Only the `max_tokens` rule reads the model's
    own window.
    """

    ratio: float = TRIGGER_RATIO
    tokens: int | None = None

    def at(self, window: int, max_output_tokens: int | None = None) -> int:
        """The smallest estimate at which a request of `window` asking `max_output_tokens` is
        compacted."""
        at = math.ceil(self.ratio * window)
        if self.tokens is not None:
            at = min(at, self.tokens)
        if max_output_tokens is not None:
            at = min(at, room_for_prompt(window, max_output_tokens) + 1)
        return at

    def is_reached(self, tokens: int, window: int, max_output_tokens: int | None = None) -> bool:
        return tokens >= self.at(window, max_output_tokens)

    def effective_window(self, window: int) -> int:
        """The window the other ratios are shares of: `window`, or, when the absolute trigger
        comes before `ratio` of it, the smaller one whose `ratio` it is (200k at 0.85: 235,294)."""
        if self.tokens is None or self.tokens >= self.ratio * window:
            return window
        return int(self.tokens / self.ratio)


def target_tokens(
    window: int,
    target_ratio: float,
    max_output_tokens: int | None,
    trigger: Trigger | None = None,
) -> int:
    """The prompt size to aim for: `target_ratio` of the window (of the trigger's effective
    window: Trigger), and room for the output.

    A caller asking for a large `max_tokens` brings the trigger down to where the prompt stops
    fitting with it; the target comes down in proportion (`target_ratio / trigger ratio` of that
    limit), so as many requests go by before the next compaction as at the ratio's trigger.
    Only the room left free for the output (Claude Code asks 128k of a 200k window: trigger at
    70k, target 29k) would leave a compaction on nearly every request.
    """
    shares = window if trigger is None else trigger.effective_window(window)
    target = int(target_ratio * shares)
    if max_output_tokens is not None:
        ratio = TRIGGER_RATIO if trigger is None else trigger.ratio
        target = min(target, int(target_ratio / ratio * room_for_prompt(window, max_output_tokens)))
    return max(target, 0)


PREVIEW_REACH = 0.5
"""Previews alone make room enough (strategy hybrid) when the request after them is at most this
share of the way from the target up to the trigger: half the growth a summary would leave
before the next compaction, without a summarizer call. Less is not worth a cache break."""


def preview_slack(
    window: int, target_ratio: float, trigger: Trigger, max_output_tokens: int | None
) -> int:
    """How far above its target previews alone may leave a request (see PREVIEW_REACH): that
    share of the room between the target and the trigger (Trigger.at: a large `max_tokens` or
    an absolute trigger brings it closer)."""
    target = target_tokens(window, target_ratio, max_output_tokens, trigger)
    room = trigger.at(window, max_output_tokens) - target
    return max(0, round(PREVIEW_REACH * room))


@dataclass(frozen=True)
class _Budget:
    """What the compacted request costs besides the kept messages."""

    fixed: int  # head + tools + reply priming
    summary: int
    target: int
    pinned: int = 0
    """The standing instructions' room: carried to the plan, not reserved. Most conversations
    lay down little (reserving it left coding agents' requests at 0.47 of the window after a
    compaction, and moved when a reserve prepared ahead is used up), and a full section costs
    at most that share of the window above the target, still well below the trigger."""

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
    strict_alternation: bool = False,
    pinned_budget_tokens: int = 0,
    trigger: Trigger | None = None,
) -> Plan:
    """Where to cut `segments` so that head + summary + kept part reaches the target.

    Over the target, as many recent blocks are kept as fit it (`keep_recent_rounds` is only the
    least one hopes for), so that the compacted request sits near the target, not far below it.
    Under the target (a caller compacting on purpose), exactly the last `keep_recent_rounds`
    rounds are kept. The conversation's task (its first request) and the request of a round cut
    inside are pinned when they fit, else quoted by the summary. With `strict_alternation`
    nothing is pinned (a pinned request after the summary would make two user turns in a row)
    and the kept part starts with a block the user did not open.

    `pinned_budget_tokens` bounds the standing instructions in the summary (see _Budget.pinned).
    `trigger`: with an absolute trigger, the target and the task's share are shares of its
    effective window (Trigger; None: of `window`).

    Deterministic and pure. A plan with keep_from == head_end folds nothing ("unchanged");
    `fits` is False (with a note) when even the smallest keepable part misses the target.
    """
    target = target_tokens(window, target_ratio, max_output_tokens, trigger)
    window = window if trigger is None else trigger.effective_window(window)  # the task's share
    budget = _Budget(
        segments.head_tokens + segments.tools_tokens + REPLY_PRIMING_TOKENS,
        summary_budget_tokens,
        target,
        pinned_budget_tokens,
    )
    user_rounds = [r for r in segments.rounds if r.has_user]
    if segments.total_tokens <= target and len(user_rounds) <= keep_recent_rounds:
        return _unchanged(segments, budget, "under target with few rounds")
    if not segments.rounds:
        return _unchanged(segments, budget, "nothing after the head to fold")
    blocks = [b for r in segments.rounds for b in r.blocks]
    first: int | None = None
    if segments.total_tokens <= target:
        kept = _kept_rounds(user_rounds, keep_recent_rounds, budget)
        if kept and _fits_from(segments, kept[0].start, budget, window):
            first = kept[0].start
    if first is None:
        first = _fill(segments, blocks, budget, window)
    if first is None:
        return _giant_last_block(segments, blocks, budget, window, strict_alternation)
    if strict_alternation:
        first = _assistant_led(segments, blocks, first)
    pinned, quoted = _pins(segments, first, window, pin=not strict_alternation)
    return _plan(segments, budget, first, pinned, quoted=quoted)


TASK_PIN_SHARE = 0.2
"""The conversation's first request is pinned verbatim while it takes at most this share of the
window; a larger one is quoted by the summary, clipped head and tail (a 7k-token task pinned in an
8k window would leave no room and make every request compact again)."""


def _fill(segments: Segments, blocks: Sequence[Block], budget: _Budget, window: int) -> int | None:
    """The earliest block from which everything after it, with its pins, fits the target."""
    first: int | None = None
    kept = 0
    for block in reversed(blocks):
        kept += block.tokens
        if not budget.fits(kept):
            break
        pinned = _pinned_tokens(segments, block.start, window)
        if block.start > segments.head_end and budget.fits(kept + pinned):
            first = block.start
    return first


def _fits_from(segments: Segments, keep_from: int, budget: _Budget, window: int) -> bool:
    kept = _kept_tokens(segments, keep_from)
    return budget.fits(kept + _pinned_tokens(segments, keep_from, window))


def _kept_tokens(segments: Segments, keep_from: int) -> int:
    """Tokens of the blocks from `keep_from` on, read from the end (blocks are in order): the
    kept part is short, the folded part may be hundreds of thousands of blocks."""
    blocks = chain.from_iterable(reversed(r.blocks) for r in reversed(segments.rounds))
    return sum(b.tokens for b in takewhile(lambda b: b.start >= keep_from, blocks))


def _wanted(segments: Segments, keep_from: int) -> list[int]:
    """The task, the cut round's request and the latest injected context of each kind
    (Segments.context), when they would be folded."""
    wanted: list[int] = []
    task = segments.task
    if task is not None and segments.head_end <= task < keep_from:
        wanted.append(task)
    wanted += [i for i, _ in segments.context if i < keep_from and i != task]
    cut_round = _round_of(segments, keep_from)
    if (
        cut_round is not None
        and cut_round.start < keep_from
        and cut_round.has_user
        and cut_round.start not in wanted
    ):
        wanted.append(cut_round.start)
    return wanted


def _pins(
    segments: Segments, keep_from: int, window: int, *, pin: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pinned, quoted): the task and the cut round's request, when they would be folded."""
    wanted = _wanted(segments, keep_from)
    if not pin:
        return (), tuple(sorted(wanted))
    limit = TASK_PIN_SHARE * window
    small = [i for i in wanted if not _is_bounded(segments, i) or _pin_tokens(segments, i) <= limit]
    return tuple(sorted(small)), tuple(sorted(set(wanted) - set(small)))


def _pinned_tokens(segments: Segments, keep_from: int, window: int) -> int:
    """`_tokens(segments, pinned)` of `_pins(..., pin=True)`, without the tuples: `_fill` asks
    for it at every block it could cut at."""
    limit = TASK_PIN_SHARE * window
    total = 0
    for i in _wanted(segments, keep_from):
        tokens = _pin_tokens(segments, i)
        if not _is_bounded(segments, i) or tokens <= limit:
            total += tokens
    return total


def _is_bounded(segments: Segments, index: int) -> bool:
    """The task and injected context are pinned only while small (TASK_PIN_SHARE): a huge one
    is quoted by the summary instead; the cut round's request always is pinned."""
    return index == segments.task or any(i == index for i, _ in segments.context)


def _pin_tokens(segments: Segments, index: int) -> int:
    """What pinning message `index` costs: its block's tokens (a request opens its block), or an
    injected-context turn's own."""
    for i, tokens in segments.context:
        if i == index:
            return tokens
    return _block_at(segments, index).tokens


def _assistant_led(segments: Segments, blocks: Sequence[Block], first: int) -> int:
    """`first`, moved back to the nearest block that a user message does not open."""
    starts = [b.start for b in blocks if b.start <= first]
    for start in reversed(starts):
        if not _block_at(segments, start).user_led:
            return start
    return segments.head_end


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


def _giant_last_block(
    segments: Segments,
    blocks: Sequence[Block],
    budget: _Budget,
    window: int,
    strict_alternation: bool,
) -> Plan:
    """Not even the latest block fits: keep it alone (never edited), with the task and its
    round's request pinned or quoted; the note says it does not fit. With `strict_alternation`
    the same rules as a fitting cut apply: nothing pinned, kept part led by a non-user block,
    even though that keeps a little more than the latest block."""
    first = blocks[-1].start
    if strict_alternation:
        first = _assistant_led(segments, blocks, first)
    pinned, quoted = _pins(segments, first, window, pin=not strict_alternation)
    return _plan(
        segments,
        budget,
        first,
        pinned,
        note="the latest block alone exceeds the target",
        quoted=quoted,
    )


def _tokens(segments: Segments, indices: Sequence[int]) -> int:
    return sum(_pin_tokens(segments, i) for i in indices)


def _plan(
    segments: Segments,
    budget: _Budget,
    keep_from: int,
    pinned: tuple[int, ...],
    note: str = "",
    quoted: tuple[int, ...] = (),
) -> Plan:
    if keep_from <= segments.head_end:
        return _unchanged(segments, budget, note or "nothing before the kept part to fold")
    kept = _kept_tokens(segments, keep_from) + _tokens(segments, pinned)
    return Plan(
        head_end=segments.head_end,
        keep_from=keep_from,
        pinned=pinned,
        tokens_before=segments.total_tokens,
        target_tokens=budget.target,
        summary_budget_tokens=budget.summary,
        fits=budget.fits(kept),
        note=note,
        quoted=quoted,
        pinned_budget_tokens=budget.pinned,
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
        pinned_budget_tokens=budget.pinned,
    )


def _block_at(segments: Segments, index: int) -> Block:
    found = segments.block_at(index)
    if found is None:
        raise ValueError(f"no block starts at message {index}")
    return found


def _round_of(segments: Segments, index: int) -> Round | None:
    return segments.round_of(index)
