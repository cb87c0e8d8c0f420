"""The compaction run: plan, summarize and extract concurrently, fall back, verify, check.

`Compactor` is what the proxy calls: `plan()` decides where to cut, `run()` produces the new
message list and a CompactionResult, and never raises.

Paths, in order of preference:
- "llm": the model's summary, plus the code-built ledger and any missing key items.
- "extractive": the model failed (raised, timed out, or answered empty, too short, without
  letters, or with a refusal); the summary is built by code from the ledger (user requests,
  tool trail, files, values), the earlier summary's entries merged in, and the extracted items.
- "dropped": not even the extractive summary fits its budget; a one-line note says how many
  messages were left out.
- "unchanged": nothing to fold, no gain, a failed check, or an internal error; the input as is.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from compaction.composition import LLM_SHARE
from compaction.memory import MemoryWriter, write_items
from compaction.mentions import MentionCache
from compaction.messages import CHAT, Shape
from compaction.offload import Inline, Offload
from compaction.plan import should_compact
from compaction.reading import LastRead
from compaction.settings import CompactionSettings
from compaction.stages import (
    FinishJob,
    FoldJob,
    Packed,
    PlanJob,
    compacted_list,
    finish,
    fold,
    make_plan,
)
from compaction.summarize import ask_both, build_memory_request, build_summary_request
from compaction.tokens import HeuristicEstimator, estimate_request
from compaction.types import ChatLLM, CompactionResult, MemoryItem, Plan, TokenEstimator

logger = logging.getLogger(__name__)

MIN_SUMMARY_TOKENS = 256
"""The smallest summary budget a plan asks for, however small the window."""


class Compactor:
    """Plans and runs compactions with one set of settings; no per-conversation state."""

    def __init__(
        self,
        *,
        settings: CompactionSettings | None = None,
        estimator: TokenEstimator | None = None,
        memory: MemoryWriter | None = None,
        clock: Callable[[], float] = time.monotonic,
        shape: Shape = CHAT,
        offload: Offload | None = None,
        mentions: MentionCache | None = None,
    ) -> None:
        """`offload` runs the CPU stages (default: inline; the proxy passes a process pool);
        `mentions` lets a longer fold scan only new texts (inline: jobs travel without it)."""
        self.settings = settings or CompactionSettings()
        self.offload: Offload = offload or Inline()
        self.crossing = not isinstance(self.offload, Inline)
        self.shape = shape
        self.estimator: TokenEstimator = estimator or HeuristicEstimator(shape=shape)
        self.memory = memory
        self.clock = clock
        self.mentions = mentions if mentions is not None else MentionCache()
        self.last_read = LastRead()  # inline: what plan() read, for the run() after it

    def estimate(
        self, messages: Sequence[Any], tools: Any = None, *, estimator: TokenEstimator | None = None
    ) -> int:
        return estimate_request(messages, tools, estimator or self.estimator)

    def needs_compaction(
        self, tokens: int, window: int, max_output_tokens: int | None = None
    ) -> bool:
        return should_compact(
            tokens,
            window,
            trigger_ratio=self.settings.trigger_ratio,
            max_output_tokens=max_output_tokens,
        )

    def summary_budget(self, window: int) -> int:
        """Tokens the summary message may take: the setting, capped by the window's share."""
        share = int(window * self.settings.summary_window_ratio)
        return max(MIN_SUMMARY_TOKENS, min(self.settings.summary_max_tokens, share))

    def plan(
        self,
        messages: Sequence[Any],
        *,
        window: int,
        tools: Any = None,
        max_output_tokens: int | None = None,
        estimator: TokenEstimator | None = None,
        target_ratio: float | None = None,
    ) -> Plan:
        """Where to cut; `target_ratio` overrides the setting (a compaction prepared ahead of
        the trigger aims lower by the growth still to come)."""
        job = self._plan_job(messages, window, tools, max_output_tokens, estimator, target_ratio)
        return make_plan(job)

    async def plan_async(
        self,
        messages: Sequence[Any],
        *,
        window: int,
        tools: Any = None,
        max_output_tokens: int | None = None,
        estimator: TokenEstimator | None = None,
        target_ratio: float | None = None,
    ) -> Plan:
        """`plan()`, run through the offload (its cost grows with the whole history)."""
        job = self._plan_job(messages, window, tools, max_output_tokens, estimator, target_ratio)
        return await self.offload.run(make_plan, job)

    def _plan_job(self, messages: Sequence[Any], window: int, *rest: Any) -> PlanJob:
        tools, max_output_tokens, estimator, target_ratio = rest
        estimator = estimator or self.estimator
        return PlanJob(
            messages=Packed.of(messages, crossing=self.crossing),
            tools=tools,
            estimator=estimator,
            # A request's own HeuristicEstimator also says how its messages read (its shape).
            shape=getattr(estimator, "shape", self.shape),
            window=window,
            target_ratio=target_ratio or self.settings.target_ratio,
            keep_recent_rounds=self.settings.keep_recent_rounds,
            summary_budget_tokens=self.summary_budget(window),
            max_output_tokens=max_output_tokens,
            strict_alternation=self.settings.strict_alternation,
            reading=None if self.crossing else self.last_read,
        )

    async def flush_memory(
        self, session_id: str | None, compaction_id: str, items: Sequence[MemoryItem]
    ) -> str | None:
        """Append `items` to the session's memory file; the error, if writing failed."""
        return await write_items(self.memory, session_id, compaction_id, items)

    async def run(
        self,
        messages: list[Any],
        plan: Plan,
        *,
        llm: ChatLLM | None,
        session_id: str | None,
        tools: Any = None,
        estimator: TokenEstimator | None = None,
        flush_memory: bool = True,
    ) -> CompactionResult:
        """Apply `plan` to `messages`; on any failure the input comes back unchanged, with why.
        With `flush_memory` False the memory items are only returned (a compaction prepared
        ahead of need writes them with `flush_memory()` when it is applied, if ever)."""
        run = _Run(self, messages, plan, tools, estimator or self.estimator)
        try:
            return await run.execute(llm, session_id, flush_memory=flush_memory)
        except Exception as exc:  # fail open: the agent's request must go out regardless
            logger.warning("compaction failed, forwarding unchanged: %r", exc, exc_info=True)
            return run.unchanged("internal error", errors=(f"{type(exc).__name__}: {exc}",))


class _Run:
    """One compaction of one message list (keeps the per-run values out of Compactor)."""

    def __init__(
        self,
        compactor: Compactor,
        messages: list[Any],
        plan: Plan,
        tools: Any,
        estimator: TokenEstimator,
    ) -> None:
        self.compactor = compactor
        self.settings = compactor.settings
        self.messages = messages
        # A request's HeuristicEstimator reads in its own shape (see Compactor.plan).
        self.shape: Shape = getattr(estimator, "shape", compactor.shape)
        self.plan = plan
        self.tools = tools
        self.estimator = estimator
        self.started = compactor.clock()
        self.compaction_id = uuid.uuid4().hex
        self.errors: list[str] = []

    def unchanged(self, reason: str, *, errors: tuple[str, ...] = ()) -> CompactionResult:
        return CompactionResult(
            messages=self.messages,
            path="unchanged",
            reason=reason,
            keep_from=0,
            prefix_len=0,
            summary_text="",
            summary_message=None,
            memory_items=(),
            verification=None,
            tokens_before=self.plan.tokens_before,
            tokens_after=self.plan.tokens_before,
            fits=self.plan.tokens_before <= self.plan.target_tokens,
            compaction_id=self.compaction_id,
            duration_s=self.compactor.clock() - self.started,
            errors=(*self.errors, *errors),
        )

    async def execute(
        self, llm: ChatLLM | None, session_id: str | None, *, flush_memory: bool = True
    ) -> CompactionResult:
        plan, messages, shape = self.plan, self.messages, self.shape
        folded = plan.folded
        if not folded:
            return self.unchanged(plan.note or "nothing to fold")
        offload, crossing = self.compactor.offload, self.compactor.crossing
        prepared = await offload.run(
            fold,
            FoldJob(
                folded=Packed.of([messages[i] for i in folded], crossing=crossing),
                shape=shape,
                estimator=self.estimator,
                settings=self.settings,
                summary_budget_tokens=plan.summary_budget_tokens,
                mentions=None if crossing else self.compactor.mentions,
                items=None if crossing else self.compactor.last_read.take(messages, folded, shape),
            ),
        )
        if prepared.too_little:
            # Decided before paying for two model calls whose result would be thrown away.
            return self.unchanged("too little to fold: a summary would not be smaller")
        summary_max_tokens = max(64, int(prepared.body_budget * LLM_SHARE))
        summary_reply, memory_reply = await ask_both(
            llm,
            build_summary_request(
                prepared.transcript,
                # The model updates its own text; code carries the ledger and key items forward.
                previous_summary=(prepared.previous.lead or None) if prepared.previous else None,
                max_tokens=summary_max_tokens,
                cjk=prepared.cjk,
            ),
            summary_max_tokens,
            build_memory_request(prepared.transcript, cjk=prepared.cjk),
            self.settings.memory_max_tokens,
            timeout_s=self.settings.llm_timeout_s,
        )
        done = await offload.run(
            finish,
            FinishJob(
                messages=Packed.of(messages, crossing=crossing),
                plan=plan,
                tools=self.tools,
                shape=shape,
                estimator=self.estimator,
                fold=prepared,
                summary_reply=summary_reply.text,
                memory_reply=memory_reply.text,
            ),
        )
        self.errors += [
            e for e in (summary_reply.error, memory_reply.error, done.memory_error) if e is not None
        ]
        if done.problems:
            logger.warning("compacted list failed its check: %s", "; ".join(done.problems))
            return self.unchanged("check failed: " + "; ".join(done.problems[:3]))
        if done.tokens_after >= plan.tokens_before:
            return self.unchanged("compaction would not make the request smaller")

        # The list is rebuilt here from the caller's own objects (a job's result is a copy).
        inserted = done.summary_message
        compacted = compacted_list(messages, plan, inserted)
        memory_items = done.memory_items
        if flush_memory and (
            error := await self.compactor.flush_memory(session_id, self.compaction_id, memory_items)
        ):
            self.errors.append(error)
        return CompactionResult(
            messages=compacted,
            path=done.summary.path,
            reason=plan.note or f"folded {len(folded)} messages",
            keep_from=plan.keep_from,
            prefix_len=plan.head_end + 1 + len(plan.pinned),
            summary_text=done.summary.body,
            summary_message=inserted,
            memory_items=memory_items,
            verification=done.verification,
            tokens_before=plan.tokens_before,
            tokens_after=done.tokens_after,
            fits=plan.fits and done.tokens_after <= plan.target_tokens,
            compaction_id=self.compaction_id,
            duration_s=self.compactor.clock() - self.started,
            folded_count=len(folded),
            errors=tuple(self.errors),
        )
