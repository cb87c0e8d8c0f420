"""The compactions of every conversation: remembered, and running.

Checkpoints are looked up by prefix digest in the store and substituted; a conversation still
over the trigger is compacted further once, however many requests wait (single-flight). Each
compaction is stored as a checkpoint and recorded (proxy.compacting.records). Preparing the next
checkpoint ahead of the trigger is proxy.compacting.precompute; the per-request decisions
(parsing, headers, retries) are proxy.compacting.hook and proxy.compacting.exchange.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from compaction import (
    ChatLLM,
    Checkpoint,
    CheckpointStore,
    Compaction,
    CompactionResult,
    Compactor,
    DigestPrefix,
    View,
    checkpoint_after,
    plan_key,
    prefix_digests,
)
from proxy.compacting.archiving import Archiving
from proxy.compacting.fallback import fallback
from proxy.compacting.flight import (
    SingleFlight,
    is_running,
    run_once_everywhere,
    wait_for_running,
    wait_shielded,
)
from proxy.compacting.forwarded import Forwarded
from proxy.compacting.llm_client import LLMFactory
from proxy.compacting.records import folded_range, record_compaction
from proxy.compacting.request import Decision, ParsedRequest
from proxy.compacting.reserves import ReserveMemory
from proxy.compacting.stores.backend import StateBackend, stored_under
from proxy.http.sessions import SessionRecords
from proxy.metrics import CompactionMetrics
from proxy.settings import CompactionSection
from proxy.tasks import BackgroundTasks


class Conversations:
    def __init__(
        self,
        options: CompactionSection,
        *,
        compactor: Compactor,
        store: CheckpointStore,
        state: StateBackend,
        llm_for: LLMFactory,
        records: SessionRecords,
        metrics: CompactionMetrics,
        tasks: BackgroundTasks,
        archiving: Archiving | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._compactor = compactor
        self._store = store
        self._llm_for = llm_for
        self._records = records
        self._metrics = metrics
        self._clock = clock
        self._archiving = archiving
        self._state = state  # cooldowns and cross-process leases (proxy.compacting.stores)
        self._flight: SingleFlight[bytes, CompactionResult | Checkpoint] = SingleFlight(tasks)
        # Precomputes still planning, by their request's last digest (proxy.compacting.precompute).
        self.planning: SingleFlight[bytes, None] = SingleFlight(tasks)
        self._reserves = ReserveMemory(compactor, tasks, options.checkpoint_max_entries)
        self._forwarded = Forwarded(state, options.checkpoint_max_entries)

    def estimate(self, req: ParsedRequest, messages: list[Any]) -> int:
        return self._compactor.estimate(messages, req.extras, estimator=req.estimator)

    def needs(self, req: ParsedRequest, tokens: int) -> bool:
        return self._compactor.needs_compaction(tokens, req.window, req.max_output_tokens)

    async def compact(
        self, req: ParsedRequest, before: int, digests: Sequence[bytes] | None = None
    ) -> Decision:
        """At the trigger: reuse a checkpoint whose view fits, else wait for a compaction of this
        conversation already under way (a precompute still planning included), else compact the
        view once more (`digests`: known)."""
        deadline = self._clock() + self._options.summary_timeout_s
        digests = digests or prefix_digests(req.messages, req.seed)
        view, tokens, _ = await self.view(req, digests, before)
        if view.base is not None and not self.needs(req, tokens):
            return await self._reused(view, before, tokens)
        remaining = max(0.0, deadline - self._clock())
        running = self._flight, self._state, digests, remaining
        if await wait_for_running(*running, starting=self.planning):
            view, tokens, _ = await self.view(req, digests)
            if view.base is not None and not self.needs(req, tokens):
                return await self._reused(view, before, tokens)
        return await self._compact_view(req, view, tokens, digests, before, deadline, "trigger")

    async def compact_after_overflow(self, req: ParsedRequest, before: int) -> Decision:
        """The upstream refused the forwarded view as too long (`req` carries the corrected
        budget): compact further now. A checkpoint held in reserve is the first step; nothing is
        reused or waited for on the strength of the estimate that just proved wrong."""
        deadline = self._clock() + self._options.summary_timeout_s
        digests = prefix_digests(req.messages, req.seed)
        view, tokens, reserve = await self.view(req, digests)
        if reserve is not None:
            view = View.of(req.messages, reserve)
            tokens = self.estimate(req, view.messages)
            await self.flush_reserve(req, reserve)
        return await self._compact_view(req, view, tokens, digests, before, deadline, "overflow")

    # -- shared with proxy.compacting.precompute and recall -------------------------------------

    async def latest(self, digests: Sequence[bytes], count: int) -> Checkpoint | None:
        """The checkpoint of the longest remembered prefix of `count` messages but the last."""
        return await self._store.longest(DigestPrefix(digests, count - 1))

    async def view(
        self, req: ParsedRequest, digests: Sequence[bytes], original_tokens: int | None = None
    ) -> tuple[View, int, Checkpoint | None]:
        """The view to forward, its tokens (`original_tokens`: the original's, when known), and
        a precomputed checkpoint still held in reserve.

        A checkpoint prepared ahead of the trigger is used only once the view it extends (its
        parent's, or the original) reaches the trigger: applied earlier, it would move every
        compaction after the first down to the precompute ratio. A reserve that goes out has its
        memory items written, if they are not yet (an earlier write may have failed).
        """
        newest = await self.latest(digests, len(digests))
        view = View.of(req.messages, newest)
        if newest is None and original_tokens is not None:
            return view, original_tokens, None
        if newest is None or not newest.precomputed:
            return view, self.estimate(req, view.messages), None
        parent = await self.stored(digests, newest.parent)
        parent_view = View.of(req.messages, parent)
        parent_tokens = self.estimate(req, parent_view.messages)
        if self.needs(req, parent_tokens):
            await self.flush_reserve(req, newest)
            return view, self.estimate(req, view.messages), None
        if parent is not None and parent.precomputed:
            await self.flush_reserve(req, parent)
        return parent_view, parent_tokens, newest

    async def plan(
        self, req: ParsedRequest, view: View, *, target_ratio: float | None = None
    ) -> Compaction:
        return await self._compactor.prepare(
            view.messages,
            window=req.window,
            tools=req.extras,
            max_output_tokens=req.max_output_tokens,
            estimator=req.estimator,
            target_ratio=target_ratio,
            messages_json=req.messages_json(view.messages),
        )

    async def is_running(self, digests: Sequence[bytes]) -> bool:
        """True while a compaction of this conversation runs, here or in another process."""
        return await is_running(self._flight, self._state, digests)

    def start(
        self,
        req: ParsedRequest,
        view: View,
        compaction: Compaction,
        digests: Sequence[bytes],
        reason: str,
    ) -> asyncio.Task[CompactionResult | Checkpoint] | None:
        """The (single-flight) summarization carrying out `compaction`, or the checkpoint
        another process stored for it; None if it folds nothing new."""
        key = plan_key(view, compaction.plan, digests)
        if key is None:
            return None
        return self._flight.start(
            key,
            lambda: run_once_everywhere(
                self._state,
                key,
                lambda: self._summarize(req, view, compaction, digests, reason),
                lambda: self.stored(digests, key),
                # As long as the summarizer call itself may take (see hook.build_hook).
                budget_s=self._options.summary_timeout_s * 3,
            ),
            name=f"{reason}:{req.session_id}",
        )

    # -- compacting ----------------------------------------------------------------------------

    async def _compact_view(
        self,
        req: ParsedRequest,
        view: View,
        tokens: int,
        digests: Sequence[bytes],
        before: int,
        deadline: float,
        reason: str,
    ) -> Decision:
        compaction = await self.plan(req, view)
        key = plan_key(view, compaction.plan, digests)
        joined = key is not None and key in self._flight
        task = self.start(req, view, compaction, digests, reason)
        if task is None:
            return await self._as_is(view, before, tokens)
        try:
            result = await wait_shielded(task, max(0.0, deadline - self._clock()))
            if joined and not isinstance(result, Checkpoint) and result.path != "unchanged":
                # Another request's list, with its own last turns: take the stored checkpoint.
                stored = await self.stored(digests, key)
                if stored is None or stored.compaction_id != result.compaction_id:
                    raise LookupError(f"no checkpoint of compaction {result.compaction_id}")
                result = stored
        except Exception as exc:
            # Timed out: the summarization goes on and records its checkpoint for the next
            # request. Failed: it was logged where it ran. This request goes out now on the
            # fallback, which flushes memory too: the summarization may yet fold nothing.
            if isinstance(exc, TimeoutError):
                self._metrics.summary_timeouts.inc()
            result = await fallback(self._run(req, compaction, llm=None), compaction)
        if not isinstance(result, Checkpoint) and result.path == "unchanged":
            return await self._as_is(view, before, tokens)
        # "applied": computed for this request, or the first to go out with it (a checkpoint).
        first = await self._forwarded.add(result.compaction_id)
        status = "applied" if first or not isinstance(result, Checkpoint) else "reused"
        # What goes out may be a reserve: stored by another replica (met through the lease) or
        # by a precompute here that this request joined. Its memory items are due now.
        reserve = result if isinstance(result, Checkpoint) else await self.stored(digests, key)
        if reserve and reserve.precomputed and reserve.compaction_id == result.compaction_id:
            await self.flush_reserve(req, reserve)
        if isinstance(result, Checkpoint):  # compacted for another request, or process
            done = View.of(req.messages, result)
            tokens = self.estimate(req, done.messages)
            return Decision(done.messages, status, before, tokens, result.compaction_id)
        return Decision(result.messages, status, before, result.tokens_after, result.compaction_id)

    async def _as_is(self, view: View, before: int, tokens: int) -> Decision:
        """Nothing more could be folded: the view goes out as it is. Only a view that is the
        original request means the compaction failed; one built on a checkpoint still carries
        an earlier compaction."""
        if view.base is None:
            return Decision(view.messages, "failed", before, tokens, None)
        return await self._reused(view, before, tokens)

    async def _reused(self, view: View, before: int, tokens: int) -> Decision:
        """`view` substitutes a checkpoint: "reused", or "applied" the first time it goes out."""
        assert view.base is not None
        status = await self.substituted(view.base.compaction_id)
        return Decision(view.messages, status, before, tokens, view.base.compaction_id)

    async def substituted(self, compaction_id: str) -> str:
        """Count a checkpoint going out: "reused", or "applied" the first time it does."""
        self._metrics.checkpoint_hits.inc()
        return "applied" if await self._forwarded.is_new(compaction_id) else "reused"

    async def _summarize(
        self,
        req: ParsedRequest,
        view: View,
        compaction: Compaction,
        digests: Sequence[bytes],
        reason: str,
    ) -> CompactionResult:
        summary_model = self._options.summary_model or req.model
        # One tenant's failing key must not cool the summarizer down for everyone.
        cooldown_key = f"{summary_model}\x00{req.tenant.hex()}"
        llm: ChatLLM | None = None
        if await self._state.is_cooling(cooldown_key):
            self._metrics.cooldown_skips.inc()
        else:
            llm = self._llm_for(req.summarizer(summary_model))
        # A precomputed compaction may never be applied: its memory items wait in its checkpoint.
        result = await self._run(req, compaction, llm=llm, flush=reason != "precompute")
        if llm is not None and result.path != "unchanged":
            # "unchanged" says nothing about the summarizer (nothing to fold, or no gain).
            ok = result.path == "llm"
            await self._state.record_outcome(cooldown_key, ok=ok)
            self._metrics.summarizer_seconds.observe(result.duration_s)
            if not ok:
                self._metrics.summarizer_failures.inc()
        checkpoint = checkpoint_after(view, result, digests, precomputed=reason == "precompute")
        if checkpoint is not None:
            await self._store.put(checkpoint)
        folded = folded_range(view, checkpoint)
        if folded is not None and self._archiving is not None:
            self._archiving.keep(req, range(*folded), result.compaction_id)
        record_compaction(
            self._records, self._metrics, req, view, result, reason=reason, checkpoint=checkpoint
        )
        return result

    async def _run(
        self, req: ParsedRequest, compaction: Compaction, *, llm: ChatLLM | None, flush: bool = True
    ) -> CompactionResult:
        return await compaction.run(llm=llm, session_id=req.session_id, flush_memory=flush)

    async def flush_reserve(self, req: ParsedRequest, reserve: Checkpoint) -> None:
        """A precomputed checkpoint goes out: its memory items are due now, if not yet written
        (proxy.compacting.reserves)."""
        await self._reserves.flush(req.session_id, reserve)

    async def stored(self, digests: Sequence[bytes], key: bytes | None) -> Checkpoint | None:
        return await stored_under(self._store, digests, key)
