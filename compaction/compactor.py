"""The compactor, and one compaction: plan where to cut, then run it (summarize and extract
concurrently, fall back, verify, check, write the memory file).

    compaction = await compactor.prepare(messages, window=window, tools=tools)
    result = await compaction.run(llm=my_llm, session_id="agent-1")

`Compactor.prepare` plans in the offload and gives a `Compaction`: the plan, and what planning
read of the messages (their Items and tokens, in process; their JSON, for jobs that cross to
another process), which its run takes instead of reading or serializing the history again.
`Compaction.run` produces the new message list and a CompactionResult, and never raises.

Paths, in order of preference:
- "llm": the model's summary, plus the code-built ledger and any missing key items.
- "extractive": the model failed (raised, timed out, or answered empty, too short, without
  letters, or with a refusal); the summary is built by code from the ledger (user requests,
  tool trail, files, values), the earlier summary's entries merged in, and the extracted items.
- "dropped": not even the extractive summary fits its budget; a one-line note says how many
  messages were left out.
- "selective": the plan reduced old tool outputs to previews (compaction.selective, chosen when
  planning with `strategy` selective or hybrid), which make room enough without a summary
  (plan.preview_slack).
- "unchanged": nothing to fold, no gain, a failed check, or an internal error; the input as is.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from compaction.composition import LLM_SHARE
from compaction.invariants import check_compacted
from compaction.memory import MemoryWriter, write_items
from compaction.mentions import MentionCache
from compaction.messages import CHAT, Shape
from compaction.offload import Inline, JobMessages, JsonArray, Offload, OffloadLost
from compaction.plan import Trigger, preview_slack
from compaction.selective import apply_previews
from compaction.settings import CompactionSettings
from compaction.stages import (
    FinishJob,
    FoldJob,
    PlanJob,
    Reading,
    compacted_list,
    drop_folded,
    finish,
    fold,
    make_plan,
)
from compaction.summarize import Question, ask_summarizer, describe_kept
from compaction.tokens import HeuristicEstimator, estimate_request
from compaction.types import (
    ChatLLM,
    CompactionResult,
    MemoryItem,
    Message,
    Plan,
    TokenEstimator,
    Tools,
)

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
        `mentions` lets a longer fold scan only new texts (inline; a job sent to another process
        travels without it and uses that process's own, `stages.worker_mentions`)."""
        self.settings = settings or CompactionSettings()
        self.trigger = Trigger(self.settings.trigger_ratio, self.settings.trigger_tokens)
        self.offload: Offload = offload or Inline()
        self.crossing: bool = self.offload.crossing
        self.shape = shape
        self.estimator: TokenEstimator = estimator or HeuristicEstimator(shape=shape)
        self.memory = memory
        self.clock = clock
        self.mentions = mentions if mentions is not None else MentionCache()

    def estimate(
        self,
        messages: Sequence[Message],
        tools: Tools = None,
        *,
        estimator: TokenEstimator | None = None,
    ) -> int:
        return estimate_request(messages, tools, estimator or self.estimator)

    def needs_compaction(
        self, tokens: int, window: int, max_output_tokens: int | None = None
    ) -> bool:
        return self.trigger.is_reached(tokens, window, max_output_tokens)

    def summary_budget(self, window: int) -> int:
        """Tokens the summary message may take: the setting, capped by the (effective) window's
        share."""
        share = int(self.trigger.effective_window(window) * self.settings.summary_window_ratio)
        return max(MIN_SUMMARY_TOKENS, min(self.settings.summary_max_tokens, share))

    def plan(
        self,
        messages: Sequence[Message],
        *,
        window: int,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        estimator: TokenEstimator | None = None,
        target_ratio: float | None = None,
    ) -> Plan:
        """Where to cut, decided in the caller's thread; nothing is kept (to carry a plan out,
        `prepare`, or `Compaction(self, messages, plan)` for a plan made here)."""
        estimator = estimator or self.estimator
        sent = JobMessages.of(messages, crossing=False)
        job = self._plan_job(sent, window, tools, max_output_tokens, estimator, target_ratio)
        return make_plan(job).plan

    async def prepare(
        self,
        messages: list[Message],
        *,
        window: int,
        tools: Tools = None,
        max_output_tokens: int | None = None,
        estimator: TokenEstimator | None = None,
        target_ratio: float | None = None,
        messages_json: JsonArray | None = None,
    ) -> Compaction:
        """The compaction of `messages`, planned through the offload (its cost grows with the
        whole history); `target_ratio` overrides the setting (a compaction prepared ahead of
        the trigger aims lower by the growth still to come).

        `messages_json`: the messages as a JSON array, when the caller has that already (the
        proxy has its client's bytes): the history then crosses to a worker process without
        being serialized on the caller's thread. It must parse to `messages`."""
        estimator = estimator or self.estimator
        sent = JobMessages.of(messages, crossing=self.crossing, json=messages_json)
        job = self._plan_job(
            sent,
            window,
            tools,
            max_output_tokens,
            estimator,
            target_ratio,
            # In process, the run takes the Items and tokens the plan read (the same objects).
            keep_reading=not self.crossing,
        )
        planned = await self.offload.run(make_plan, job)
        return Compaction(
            self,
            messages,
            planned.plan,
            tools=tools,
            estimator=estimator,
            sent=sent,
            reading=planned.reading,
        )

    def _plan_job(
        self,
        sent: JobMessages,
        window: int,
        tools: Tools,
        max_output_tokens: int | None,
        estimator: TokenEstimator,
        target_ratio: float | None,
        *,
        keep_reading: bool = False,
    ) -> PlanJob:
        return PlanJob(
            messages=sent,
            tools=tools,
            estimator=estimator,
            shape=self.shape_of(estimator),
            window=window,
            target_ratio=target_ratio or self.settings.target_ratio,
            keep_recent_rounds=self.settings.keep_recent_rounds,
            summary_budget_tokens=self.summary_budget(window),
            max_output_tokens=max_output_tokens,
            strict_alternation=self.settings.strict_alternation,
            pinned_budget_tokens=int(
                self.trigger.effective_window(window) * self.settings.pinned_ratio
            ),
            keep_reading=keep_reading,
            strategy=self.settings.strategy,
            preview_slack=preview_slack(
                window, self.settings.target_ratio, self.trigger, max_output_tokens
            ),
            trigger=self.trigger,
        )

    def shape_of(self, estimator: TokenEstimator) -> Shape:
        """How a request's messages read: a request's own HeuristicEstimator says (its shape),
        else the compactor's shape."""
        return estimator.shape if isinstance(estimator, HeuristicEstimator) else self.shape

    async def flush_memory(
        self, session_id: str | None, compaction_id: str, items: Sequence[MemoryItem]
    ) -> str | None:
        """Append `items` to the session's memory file; the error, if writing failed."""
        return await write_items(self.memory, session_id, compaction_id, items)


@dataclass
class _Attempt:
    """One run of a compaction: its id, start and the errors met on the way."""

    compaction_id: str
    started: float
    errors: list[str] = field(default_factory=list)


class Compaction:
    """One compaction of one message list: its plan, and what planning read of the messages,
    for its run (`Compactor.prepare` makes one; any plan of these messages may be given)."""

    def __init__(
        self,
        compactor: Compactor,
        messages: list[Message],
        plan: Plan,
        *,
        tools: Tools = None,
        estimator: TokenEstimator | None = None,
        sent: JobMessages | None = None,
        reading: Reading | None = None,
    ) -> None:
        """`sent`: the messages as made ready for the jobs (else made here); `reading`: the
        Items and tokens of every message, by `estimator` (else the run reads what it folds)."""
        self.compactor = compactor
        self.messages = messages
        self.plan = plan
        self.tools = tools
        self.estimator: TokenEstimator = estimator or compactor.estimator
        self.shape: Shape = compactor.shape_of(self.estimator)
        self._sent = sent
        self._reading = reading

    async def run(
        self, *, llm: ChatLLM | None, session_id: str | None, flush_memory: bool = True
    ) -> CompactionResult:
        """Carry the plan out; on any failure the input comes back unchanged, with why, but for
        a job the offload lost (`OffloadLost`, reported by the offload): raised as it is. With
        `flush_memory` False the memory items are only returned (a compaction prepared ahead
        of need writes them with `Compactor.flush_memory()` when it is applied, if ever). A
        second run (say, without the model, when the first takes too long) reads for itself."""
        attempt = _Attempt(uuid.uuid4().hex, self.compactor.clock())
        try:
            return await self._run(attempt, llm, session_id, flush_memory=flush_memory)
        except OffloadLost:
            raise
        except Exception as exc:  # fail open: the agent's request must go out regardless
            logger.warning("compaction failed, forwarding unchanged: %r", exc, exc_info=True)
            return self._unchanged(
                attempt, "internal error", errors=(f"{type(exc).__name__}: {exc}",)
            )

    def dropped(self) -> CompactionResult:
        """The last resort, at no cost that grows with the folded part: the folded messages
        left out with a one-line note (the input unchanged if that fails its check)."""
        return drop_folded(
            self.messages,
            self.plan,
            shape=self.shape,
            tools=self.tools,
            estimator=self.estimator,
            compaction_id=uuid.uuid4().hex,
        )

    def _unchanged(
        self, attempt: _Attempt, reason: str, *, errors: tuple[str, ...] = ()
    ) -> CompactionResult:
        plan = self.plan
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
            tokens_before=plan.tokens_before,
            tokens_after=plan.tokens_before,
            fits=plan.tokens_before <= plan.target_tokens,
            compaction_id=attempt.compaction_id,
            duration_s=self.compactor.clock() - attempt.started,
            errors=(*attempt.errors, *errors),
        )

    def _previewed(self, attempt: _Attempt) -> CompactionResult:
        """A selective plan carried out: its previews in place, checked like any result."""
        plan, messages = self.plan, self.messages
        compacted = apply_previews(messages, plan.previews)
        problems = check_compacted(messages, compacted, plan, shape=self.shape)
        if problems:
            logger.warning("previewed list failed its check: %s", "; ".join(problems))
            return self._unchanged(attempt, "check failed: " + "; ".join(problems[:3]))
        tokens_after = estimate_request(compacted, self.tools, self.estimator)
        if tokens_after >= plan.tokens_before:
            return self._unchanged(attempt, "previews would not make the request smaller")
        end = plan.previews[-1][0] + 1
        return CompactionResult(
            messages=compacted,
            path="selective",
            reason=f"reduced {len(plan.previews)} old tool outputs to previews",
            keep_from=end,
            prefix_len=end,
            summary_text="",
            summary_message=None,
            memory_items=(),
            verification=None,
            tokens_before=plan.tokens_before,
            tokens_after=tokens_after,
            fits=plan.fits,  # previews that make room enough (plan.preview_slack), not the target
            compaction_id=attempt.compaction_id,
            duration_s=self.compactor.clock() - attempt.started,
            errors=tuple(attempt.errors),
            previews=plan.previews,
        )

    def _job_messages(self) -> JobMessages:
        if self._sent is None:
            self._sent = JobMessages.of(self.messages, crossing=self.compactor.crossing)
        return self._sent

    def _take_reading(self) -> Reading | None:
        """What the plan read, for one run only: it holds the whole history's Items."""
        reading, self._reading = self._reading, None
        return reading

    async def _run(
        self,
        attempt: _Attempt,
        llm: ChatLLM | None,
        session_id: str | None,
        *,
        flush_memory: bool,
    ) -> CompactionResult:
        compactor, plan, messages = self.compactor, self.plan, self.messages
        if plan.previews:
            return self._previewed(attempt)
        if not plan.summarize:
            llm = None  # strategy "selective": no model call, the summary is built by code
        folded = plan.folded
        if not folded:
            return self._unchanged(attempt, plan.note or "nothing to fold")
        sent = self._job_messages()
        reading = self._take_reading()
        prepared = await compactor.offload.run(
            fold,
            FoldJob(
                messages=sent,
                plan=plan,
                shape=self.shape,
                estimator=self.estimator,
                settings=compactor.settings,
                mentions=None if compactor.crossing else compactor.mentions,
                items=[reading.items[i] for i in folded] if reading is not None else None,
                counts=[reading.counts[i] for i in folded] if reading is not None else None,
            ),
        )
        if prepared.too_little:
            # Decided before paying for two model calls whose result would be thrown away.
            return self._unchanged(attempt, "too little to fold: a summary would not be smaller")
        settings = compactor.settings
        summary_max_tokens = max(64, int(prepared.body_budget * LLM_SHARE))
        summary_reply, memory_reply, model_calls = await ask_summarizer(
            llm,
            Question(
                transcript=prepared.transcript,
                # The model updates its own text; code carries the ledger and key items forward.
                previous_summary=(prepared.previous.lead or None) if prepared.previous else None,
                summary_max_tokens=summary_max_tokens,
                memory_max_tokens=settings.memory_max_tokens,
                cjk=prepared.cjk,
                kept=describe_kept(messages, plan.keep_from, self.shape),
            ),
            timeout_s=settings.llm_timeout_s,
        )
        done = await compactor.offload.run(
            finish,
            FinishJob(
                messages=sent,
                plan=plan,
                tools=self.tools,
                shape=self.shape,
                estimator=self.estimator,
                fold=prepared,
                summary_reply=summary_reply.text,
                memory_reply=memory_reply.text,
            ),
        )
        attempt.errors += [
            e for e in (summary_reply.error, memory_reply.error, done.memory_error) if e is not None
        ]
        if done.problems:
            logger.warning("compacted list failed its check: %s", "; ".join(done.problems))
            return self._unchanged(attempt, "check failed: " + "; ".join(done.problems[:3]))
        if done.tokens_after >= plan.tokens_before:
            return self._unchanged(attempt, "compaction would not make the request smaller")

        # The list is rebuilt here from the caller's own objects (a job's result is a copy).
        inserted = done.summary_message
        compacted = compacted_list(messages, plan, inserted)
        memory_items = done.memory_items
        if flush_memory and (
            error := await compactor.flush_memory(session_id, attempt.compaction_id, memory_items)
        ):
            attempt.errors.append(error)
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
            compaction_id=attempt.compaction_id,
            duration_s=compactor.clock() - attempt.started,
            folded_count=len(folded),
            errors=tuple(attempt.errors),
            pinned_overflow=done.pinned_overflow,
            model_calls=model_calls,
        )
