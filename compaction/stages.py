"""The CPU stages of one compaction, around its two model calls (compaction.compactor).

`make_plan` decides where to cut; `fold` reads the folded messages and prepares what the model
is asked (transcript, ledger, budgets); `finish` turns the model's answers into the summary,
verifies it, builds the compacted list and checks it. Each is a module-level function of one
frozen, picklable job, so an `Offload` can run it in another process: a result refers to the
caller's messages by index only. Each runs with the cyclic garbage collector paused.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from compaction.composition import (
    body_budget,
    compose_pinned,
    compose_summary,
    is_too_little,
    read_previous,
)
from compaction.extract import extract_memory_items
from compaction.instructions import find_instructions
from compaction.invariants import check_compacted
from compaction.ledger import Ledger, build_ledger
from compaction.mentions import MentionCache, scan_prose
from compaction.messages import Item, Shape, read_items
from compaction.offload import JobMessages
from compaction.pinned import Pinned
from compaction.plan import Trigger, plan_compaction
from compaction.sections import Body
from compaction.segment import split
from compaction.selective import choose_previews
from compaction.settings import CompactionSettings, Strategy
from compaction.summarize import summary_message
from compaction.text import is_cjk_dominant
from compaction.tokens import count_messages, estimate_request
from compaction.transcript import render_transcript
from compaction.types import (
    CompactionResult,
    MemoryItem,
    Message,
    Plan,
    ResultPath,
    Segments,
    TokenEstimator,
    Tools,
    Verification,
)
from compaction.verify import check_preserved


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the duration (restored as it was).

    A fold builds an object or two per message (Items, Blocks, entries) that all live until it
    ends: the collector's passes triggered by those allocations (~190 for a 12k-message fold,
    one of them over the whole heap) find nothing to free and cost about a tenth of the fold.
    Cycles made meanwhile are collected by the next pass after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class PlanJob:
    messages: JobMessages
    tools: Tools
    estimator: TokenEstimator
    shape: Shape
    window: int
    target_ratio: float
    keep_recent_rounds: int
    summary_budget_tokens: int
    max_output_tokens: int | None
    strict_alternation: bool
    pinned_budget_tokens: int = 0
    keep_reading: bool = False
    """Return the Items read and the tokens counted, for the run that follows (in process
    only: sent back from another process they would cost more than reading them again)."""
    strategy: Strategy = "summary"
    preview_slack: int = 0
    """How far above the plan's target previews alone may leave the request (plan.preview_slack;
    0: they must reach the target)."""
    trigger: Trigger | None = None
    """An absolute trigger moves the target with it (plan.Trigger; None: the window's ratios)."""


class Reading(NamedTuple):
    """What a plan read of every message: its Item and its tokens (by the plan's estimator)."""

    items: list[Item]
    counts: list[int]


class Planned(NamedTuple):
    plan: Plan
    reading: Reading | None


@functools.cache
def worker_mentions() -> MentionCache:
    """A worker process's own MentionCache, for the folds sent to it (a cache does not travel
    with a job), kept from job to job. So a fold redone over a longer history (a precomputed
    compaction overtaken by the conversation) scans only the new texts there too. Only ever
    made in a process that jobs were sent to."""
    return MentionCache()


def make_plan(job: PlanJob) -> Planned:
    with collector_paused():
        return _make_plan(job)


def _make_plan(job: PlanJob) -> Planned:
    messages = job.messages.load()
    # The selective pass reads the Items too: read once, for the segments and for it.
    reads = job.keep_reading or job.strategy != "summary"
    items = read_items(messages, job.shape) if reads else None
    counts = count_messages(messages, job.estimator)
    segments = split(
        messages, job.estimator, job.tools, shape=job.shape, items=items, counts=counts
    )
    plan = plan_compaction(
        segments,
        window=job.window,
        target_ratio=job.target_ratio,
        keep_recent_rounds=job.keep_recent_rounds,
        summary_budget_tokens=job.summary_budget_tokens,
        max_output_tokens=job.max_output_tokens,
        strict_alternation=job.strict_alternation,
        pinned_budget_tokens=job.pinned_budget_tokens,
        trigger=job.trigger,
    )
    if (
        items is not None
        and job.strategy != "summary"
        and segments.total_tokens > plan.target_tokens
    ):
        plan = _select(job, plan, messages, items, counts, segments)
    if job.strategy == "selective" and not plan.previews:
        plan = replace(plan, summarize=False)
    return Planned(plan, Reading(items, counts) if job.keep_reading and items is not None else None)


def _select(
    job: PlanJob,
    plan: Plan,
    messages: Sequence[Message],
    items: Sequence[Item],
    counts: Sequence[int],
    segments: Segments,
) -> Plan:
    """The selective plan when previews alone bring the request near enough the plan's target
    (`job.preview_slack` above it: plan.preview_slack); else `plan` (the summary; for
    `strategy: selective`, built without a model call). The target is the plan's own (lower
    for a compaction prepared ahead), so the slack keeps the same room to the trigger."""
    reach = plan.target_tokens + job.preview_slack
    previews, after = choose_previews(
        messages,
        items,
        counts,
        segments,
        shape=job.shape,
        estimator=job.estimator,
        target=plan.target_tokens,
    )
    if previews and after <= reach:
        return replace(
            plan, keep_from=plan.head_end, pinned=(), quoted=(), note="", fits=True,
            previews=previews,
        )  # fmt: skip
    return plan


@dataclass(frozen=True)
class FoldJob:
    messages: JobMessages
    """The run's raw messages, all of them: made ready once for the fold and the finish (on
    the event loop, serializing a long history to JSON is the cost that grows)."""
    plan: Plan
    """Which of them are folded (`plan.folded`)."""
    shape: Shape
    estimator: TokenEstimator
    settings: CompactionSettings
    mentions: MentionCache | None = None
    """What earlier folds found in the same texts (only in process: a cache does not travel;
    a job that crossed to a worker process uses the worker's own, `worker_mentions`)."""
    origin: int = field(default_factory=os.getpid)
    """The process the job was made in."""
    items: list[Item] | None = None
    """The folded messages already read by the plan (only in process)."""
    counts: list[int] | None = None
    """Their tokens as the plan counted them with the same estimator (only in process)."""


@dataclass(frozen=True)
class Fold:
    too_little: bool
    previous_summary: str
    """The earlier summaries in the folded span, as text ("" when none)."""
    previous: Body | None
    """The same read back into its parts."""
    cjk: bool
    transcript: str
    ledger: Ledger
    body_budget: int


def fold(job: FoldJob) -> Fold:
    with collector_paused():
        return _fold(job)


def _fold(job: FoldJob) -> Fold:
    shape, estimator, messages = job.shape, job.estimator, job.messages.load()
    folded = [messages[i] for i in job.plan.folded]
    framing = estimator.count_message(summary_message("", shape))
    # Once: the sums below share them.
    counts = job.counts if job.counts is not None else count_messages(folded, estimator)
    if is_too_little(sum(counts), framing):
        return Fold(True, "", None, False, "", build_ledger([], []), 0)
    items = job.items if job.items is not None else read_items(folded, shape)
    previous_summary, previous = read_previous(folded, items, range(len(folded)), shape)
    fresh = [i for i, item in enumerate(items) if item.kind != "summary"]
    mentions = job.mentions
    if mentions is None and os.getpid() != job.origin:
        mentions = worker_mentions()  # one job at a time in a worker process: never shared
    prose = [items[i].text for i in fresh if items[i].is_prose]
    replaced = sum(counts[i] for i in fresh)
    return Fold(
        too_little=False,
        previous_summary=previous_summary,
        previous=previous,
        cjk=is_cjk_dominant([*prose, previous_summary]),
        transcript=render_transcript(
            items,
            fresh,
            estimator=estimator,
            max_tokens=job.settings.transcript_max_tokens,
            tool_output_clip_chars=job.settings.tool_output_clip_chars,
        ),
        ledger=build_ledger(items, fresh, scan=scan_prose if mentions is None else mentions.scan),
        body_budget=body_budget(job.plan.summary_budget_tokens, framing, replaced),
    )


@dataclass(frozen=True)
class FinishJob:
    messages: JobMessages
    plan: Plan
    tools: Tools
    shape: Shape
    estimator: TokenEstimator
    fold: Fold
    summary_reply: str | None
    memory_reply: str | None


@dataclass(frozen=True)
class Finish:
    """What the caller needs of a finished compaction, no more: a worker's result is pickled
    whole, in one call that holds the caller's GIL as long (the ledger entries with no room in
    the summary are in `memory_items` only; a 53 MiB history's overflow took 22 MiB more)."""

    memory_items: tuple[MemoryItem, ...]
    """What the memory file gets. Without their identities: computed here, they doubled what
    travels; the memory writer computes them in a thread."""
    memory_error: str | None
    summary: str
    path: ResultPath
    verification: Verification
    summary_message: Message
    problems: list[str]
    tokens_after: int
    pinned_overflow: int = 0


def finish(job: FinishJob) -> Finish:
    with collector_paused():
        return _finish(job)


def _finish(job: FinishJob) -> Finish:
    plan, shape, folded, messages = job.plan, job.shape, job.fold, job.messages.load()
    # Read again here, and only if the model's answer holds no items: cheaper than carrying
    # the folded items from one job to the next.
    fresh = (
        item for item in (shape.read(messages[i]) for i in plan.folded) if item.kind != "summary"
    )
    found, memory_error = extract_memory_items(job.memory_reply, fresh)
    summary = compose_summary(
        job.summary_reply,
        folded.previous,
        folded.ledger,
        found,
        quoted=[shape.read(messages[i]).text for i in plan.quoted],
        budget=folded.body_budget,
        folded_count=len(plan.folded),
        estimator=job.estimator,
        pinned_budget=plan.pinned_budget_tokens,
    )
    # The key decisions and user requests; what has no room is in memory_items: moved.
    keys = [i.content for i in found] + list(folded.ledger.requests)
    verification = check_preserved(keys, summary.body, moved_to_memory=True)
    inserted = summary_message(summary.body, shape)
    compacted = compacted_list(messages, plan, inserted)
    return Finish(
        memory_items=summary.memory_items(found),
        memory_error=memory_error,
        summary=summary.body,
        path=summary.path,
        verification=verification,
        summary_message=inserted,
        problems=check_compacted(messages, compacted, plan, shape=shape),
        tokens_after=estimate_request(compacted, job.tools, job.estimator),
        pinned_overflow=len(summary.pinned_left_out),
    )


def compacted_list(messages: Sequence[Message], plan: Plan, inserted: Message) -> list[Message]:
    """Head, the summary, the pinned messages and the kept tail: the same objects as given."""
    return [
        *messages[: plan.head_end],
        inserted,
        *(messages[i] for i in plan.pinned),
        *messages[plan.keep_from :],
    ]


def drop_folded(
    messages: list[Message],
    plan: Plan,
    *,
    shape: Shape,
    tools: Tools,
    estimator: TokenEstimator,
    compaction_id: str,
) -> CompactionResult:
    """The last resort, at a cost that grows with the count of folded messages and what the
    user wrote in them, not with the tool output (a compaction of a view built on a checkpoint
    folds about a window's worth; a first one of a long history, all of it): the folded messages
    left out with a one-line note after the user's standing instructions (carried forward like
    any summary does, see `carry_pinned`), checked like any result (the input unchanged if the
    check fails)."""
    folded = len(plan.folded)
    pinned = carry_pinned(messages, plan, shape=shape, estimator=estimator)
    note = f"{folded} earlier messages were omitted to fit the context window."
    body = "\n\n".join(part for part in (pinned.text, note) if part)
    inserted = summary_message(body, shape)
    compacted = compacted_list(messages, plan, inserted)
    problems = check_compacted(messages, compacted, plan, shape=shape) if folded else ["nothing"]
    tokens_after = estimate_request(compacted, tools, estimator)
    ok = not problems and tokens_after < plan.tokens_before
    return CompactionResult(
        messages=compacted if ok else messages,
        path="dropped" if ok else "unchanged",
        reason=f"dropped {folded} messages: no summary in time" if ok else "nothing to drop",
        keep_from=plan.keep_from if ok else 0,
        prefix_len=plan.head_end + 1 + len(plan.pinned) if ok else 0,
        summary_text=body if ok else "",
        summary_message=inserted if ok else None,
        memory_items=tuple(pinned.memory_items()) if ok else (),
        verification=None,
        tokens_before=plan.tokens_before,
        tokens_after=tokens_after if ok else plan.tokens_before,
        fits=ok and plan.fits and tokens_after <= plan.target_tokens,
        compaction_id=compaction_id,
        duration_s=0.0,
        folded_count=folded if ok else 0,
        errors=tuple(problems[:3]) if not ok else (),
        pinned_overflow=len(pinned.left_out) if ok else 0,
    )


def carry_pinned(
    messages: Sequence[Message], plan: Plan, *, shape: Shape, estimator: TokenEstimator
) -> Pinned:
    """The standing instructions a summary replacing `plan.folded` must hold: an earlier
    summary's section carried forward, and what the user laid down in the folded turns, within
    the plan's pinned budget (what has no room is left out, for the memory file, and counted)."""
    folded = [messages[i] for i in plan.folded]
    items = read_items(folded, shape)
    _, previous = read_previous(folded, items, range(len(folded)), shape)
    return compose_pinned(
        previous,
        find_instructions(items),
        budget=plan.pinned_budget_tokens,
        estimator=estimator,
    )
