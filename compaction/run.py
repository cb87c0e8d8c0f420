"""One compaction of one message list, as `Compactor.run` carries it out: fold the planned
messages (in the offload), ask the model for the summary and the memory items at once, finish
(summary, verification, the compacted list and its check, in the offload), write the memory
file. Any step that cannot give a smaller, valid list gives the input back unchanged, with why.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from compaction.composition import LLM_SHARE
from compaction.messages import Shape
from compaction.stages import FinishJob, FoldJob, compacted_list, finish, fold
from compaction.summarize import ask_both, build_memory_request, build_summary_request
from compaction.types import ChatLLM, CompactionResult, Plan, TokenEstimator

if TYPE_CHECKING:
    from compaction.compactor import Compactor

logger = logging.getLogger(__name__)


class Run:
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
        offload, crossing = self.compactor.offload, self.compactor.crossing
        packed = self.compactor.packings.take(plan, messages, crossing=crossing)
        folded = plan.folded
        if not folded:
            return self.unchanged(plan.note or "nothing to fold")
        taken = (
            None
            if crossing
            else self.compactor.last_read.take(messages, folded, shape, self.estimator)
        )
        prepared = await offload.run(
            fold,
            FoldJob(
                messages=packed,
                plan=plan,
                shape=shape,
                estimator=self.estimator,
                settings=self.settings,
                mentions=None if crossing else self.compactor.mentions,
                items=taken.items if taken is not None else None,
                counts=taken.counts if taken is not None else None,
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
                messages=packed,
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
            path=done.path,
            reason=plan.note or f"folded {len(folded)} messages",
            keep_from=plan.keep_from,
            prefix_len=plan.head_end + 1 + len(plan.pinned),
            summary_text=done.summary,
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
            pinned_overflow=done.pinned_overflow,
        )
