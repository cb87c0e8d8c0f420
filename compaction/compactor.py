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

from compaction.composition import (
    LLM_SHARE,
    body_budget,
    compose_summary,
    is_too_little,
    read_previous,
)
from compaction.extract import extract_memory_items
from compaction.invariants import check_compacted
from compaction.ledger import build_ledger
from compaction.memory import MemoryWriter, write_items
from compaction.messages import CHAT, Shape, read_items
from compaction.plan import plan_compaction, should_compact
from compaction.segment import split
from compaction.settings import CompactionSettings
from compaction.summarize import (
    ask_both,
    build_memory_request,
    build_summary_request,
    summary_message,
)
from compaction.text import is_cjk_dominant
from compaction.tokens import HeuristicEstimator, estimate_request
from compaction.transcript import render_transcript
from compaction.types import ChatLLM, CompactionResult, MemoryItem, Plan, TokenEstimator
from compaction.verify import check_preserved

logger = logging.getLogger(__name__)

MIN_SUMMARY_TOKENS = 256
"""The smallest summary budget a plan asks for, however small the window."""


class Compactor:
    """Plans and runs compactions with one set of settings; holds no per-conversation state."""

    def __init__(
        self,
        *,
        settings: CompactionSettings | None = None,
        estimator: TokenEstimator | None = None,
        memory: MemoryWriter | None = None,
        clock: Callable[[], float] = time.monotonic,
        shape: Shape = CHAT,
    ) -> None:
        self.settings = settings or CompactionSettings()
        self.shape = shape
        self.estimator: TokenEstimator = estimator or HeuristicEstimator(shape=shape)
        self.memory = memory
        self.clock = clock

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
        """Where to cut; `target_ratio` overrides the setting (an early compaction aims lower).
        A request's own HeuristicEstimator also says how its messages read (its shape)."""
        estimator = estimator or self.estimator
        segments = split(messages, estimator, tools, shape=getattr(estimator, "shape", self.shape))
        return plan_compaction(
            segments,
            window=window,
            target_ratio=target_ratio or self.settings.target_ratio,
            keep_recent_rounds=self.settings.keep_recent_rounds,
            summary_budget_tokens=self.summary_budget(window),
            max_output_tokens=max_output_tokens,
            strict_alternation=self.settings.strict_alternation,
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
        self.items = read_items(messages, self.shape)
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
        plan, messages, items, shape = self.plan, self.messages, self.items, self.shape
        folded = plan.folded
        if not folded:
            return self.unchanged(plan.note or "nothing to fold")
        if self._too_little(folded):
            # Decide before paying for two model calls whose result would be thrown away.
            return self.unchanged("too little to fold: a summary would not be smaller")
        previous_summary, previous = read_previous(messages, items, folded, shape)
        fresh = [i for i in folded if items[i].kind != "summary"]

        prose = [items[i].text for i in fresh if items[i].is_prose]
        cjk = is_cjk_dominant([*prose, previous_summary])
        transcript = render_transcript(
            items,
            fresh,
            estimator=self.estimator,
            max_tokens=self.settings.transcript_max_tokens,
            tool_output_clip_chars=self.settings.tool_output_clip_chars,
        )
        ledger = build_ledger(items, fresh)
        body_budget = self._body_budget(fresh)
        summary_max_tokens = max(64, int(body_budget * LLM_SHARE))
        summary_reply, memory_reply = await ask_both(
            llm,
            build_summary_request(
                transcript,
                # The model updates its own text; code carries the ledger and key items forward.
                previous_summary=(previous.lead or None) if previous is not None else None,
                max_tokens=summary_max_tokens,
                cjk=cjk,
            ),
            summary_max_tokens,
            build_memory_request(transcript, cjk=cjk),
            self.settings.memory_max_tokens,
            timeout_s=self.settings.llm_timeout_s,
        )
        found, memory_error = extract_memory_items(memory_reply.text, [items[i] for i in fresh])
        self.errors += [
            e for e in (summary_reply.error, memory_reply.error, memory_error) if e is not None
        ]
        summary = compose_summary(
            summary_reply.text,
            previous,
            ledger,
            found,
            quoted=[items[i].text for i in plan.quoted],
            budget=body_budget,
            folded_count=len(folded),
            estimator=self.estimator,
        )
        memory_items = summary.memory_items(found)
        # The key decisions and user requests; what has no room is in memory_items: moved.
        keys = [i.content for i in found] + list(ledger.requests)
        verification = check_preserved(keys, summary.body, moved_to_memory=True)

        inserted = summary_message(summary.body, shape)
        compacted = [
            *messages[: plan.head_end],
            inserted,
            *(messages[i] for i in plan.pinned),
            *messages[plan.keep_from :],
        ]
        problems = check_compacted(messages, compacted, plan, shape=shape)
        if problems:
            logger.warning("compacted list failed its check: %s", "; ".join(problems))
            return self.unchanged("check failed: " + "; ".join(problems[:3]))
        tokens_after = estimate_request(compacted, self.tools, self.estimator)
        if tokens_after >= plan.tokens_before:
            return self.unchanged("compaction would not make the request smaller")

        if flush_memory and (
            error := await self.compactor.flush_memory(session_id, self.compaction_id, memory_items)
        ):
            self.errors.append(error)
        return CompactionResult(
            messages=compacted,
            path=summary.path,
            reason=plan.note or f"folded {len(folded)} messages",
            keep_from=plan.keep_from,
            prefix_len=plan.head_end + 1 + len(plan.pinned),
            summary_text=summary.body,
            summary_message=inserted,
            memory_items=memory_items,
            verification=verification,
            tokens_before=plan.tokens_before,
            tokens_after=tokens_after,
            fits=plan.fits and tokens_after <= plan.target_tokens,
            compaction_id=self.compaction_id,
            duration_s=self.compactor.clock() - self.started,
            folded_count=len(folded),
            errors=tuple(self.errors),
        )

    def _too_little(self, folded: Sequence[int]) -> bool:
        """True when the folded messages are no bigger than the smallest summary replacing them."""
        return is_too_little(self._tokens_of(folded), self._framing_tokens())

    def _body_budget(self, fresh: Sequence[int]) -> int:
        framing, replaced = self._framing_tokens(), self._tokens_of(fresh)
        return body_budget(self.plan.summary_budget_tokens, framing, replaced)

    def _framing_tokens(self) -> int:
        return self.estimator.count_message(summary_message("", self.shape))

    def _tokens_of(self, indices: Sequence[int]) -> int:
        return sum(self.estimator.count_message(self.messages[i]) for i in indices)
