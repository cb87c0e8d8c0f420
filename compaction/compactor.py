"""The compactor: estimate, plan, run (one run is carried out by compaction.run: summarize
and extract concurrently, fall back, verify, check).

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
from collections.abc import Callable, Sequence
from typing import Any

from compaction.memory import MemoryWriter, write_items
from compaction.mentions import MentionCache
from compaction.messages import CHAT, Shape
from compaction.offload import Inline, Offload
from compaction.packing import JsonArray, Packed, Packings
from compaction.plan import should_compact
from compaction.reading import LastRead
from compaction.run import Run
from compaction.settings import CompactionSettings
from compaction.stages import PlanJob, make_plan
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
        `mentions` lets a longer fold scan only new texts (inline; a job sent to another process
        travels without it and uses that process's own, `stages.worker_mentions`)."""
        self.settings = settings or CompactionSettings()
        self.offload: Offload = offload or Inline()
        self.crossing: bool = getattr(self.offload, "crossing", True)
        self.shape = shape
        self.estimator: TokenEstimator = estimator or HeuristicEstimator(shape=shape)
        self.memory = memory
        self.clock = clock
        self.mentions = mentions if mentions is not None else MentionCache()
        self.last_read = LastRead()  # inline: what plan() read, for the run() after it
        self.packings = Packings()  # crossing: what each plan packed, for its run

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
        plan = make_plan(job)
        self.packings.keep(plan, messages, job.messages)
        return plan

    async def plan_async(
        self,
        messages: Sequence[Any],
        *,
        window: int,
        tools: Any = None,
        max_output_tokens: int | None = None,
        estimator: TokenEstimator | None = None,
        target_ratio: float | None = None,
        messages_json: JsonArray | None = None,
    ) -> Plan:
        """`plan()`, run through the offload (its cost grows with the whole history).

        `messages_json`: the messages as a JSON array, when the caller has that already (the
        proxy has its client's bytes): the history then crosses to a worker process without
        being serialized again on the caller's thread. It must parse to `messages`."""
        job = self._plan_job(
            messages, window, tools, max_output_tokens, estimator, target_ratio, messages_json
        )
        plan = await self.offload.run(make_plan, job)
        self.packings.keep(plan, messages, job.messages)
        return plan

    def _plan_job(
        self,
        messages: Sequence[Any],
        window: int,
        tools: Any,
        max_output_tokens: int | None,
        estimator: TokenEstimator | None,
        target_ratio: float | None,
        messages_json: JsonArray | None = None,
    ) -> PlanJob:
        estimator = estimator or self.estimator
        return PlanJob(
            messages=Packed.of(messages, crossing=self.crossing, json=messages_json),
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
            pinned_budget_tokens=int(window * self.settings.pinned_ratio),
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
        run = Run(self, messages, plan, tools, estimator or self.estimator)
        try:
            return await run.execute(llm, session_id, flush_memory=flush_memory)
        except Exception as exc:  # fail open: the agent's request must go out regardless
            logger.warning("compaction failed, forwarding unchanged: %r", exc, exc_info=True)
            return run.unchanged("internal error", errors=(f"{type(exc).__name__}: {exc}",))
