"""The compactions of every conversation: remembered, and running; and the one decision per
request that reads them (`Conversations.decide`).

A request's history (proxy.compacting.decision.history: a parsed list, or a remembered body's
index) is estimated; at the trigger, checkpoints are looked up by prefix digest in the store and
the view to forward is chosen (a reserve held back until the view it extends reaches the
trigger). A conversation still over the trigger is compacted further once, however many
requests wait (single-flight). Each compaction is stored as a checkpoint and recorded
(proxy.compacting.decision.records). Preparing the next checkpoint ahead of the trigger is
proxy.compacting.decision.precompute; parsing, headers and retries are proxy.compacting.hook and
proxy.compacting.decision.exchange.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compaction import (
    REPLY_PRIMING_TOKENS,
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
    room_for_prompt,
    summary_message,
)
from proxy.admin.records import SessionRecords
from proxy.compacting.background.archiving import Archiving
from proxy.compacting.background.flight import (
    SingleFlight,
    is_running,
    run_once_everywhere,
    wait_for_running,
    wait_shielded,
)
from proxy.compacting.background.reserve_writes import ReserveWrites
from proxy.compacting.background.workers import WorkerLost
from proxy.compacting.decision.applied import AppliedCompactions
from proxy.compacting.decision.fallback import GRACE_S, fallback
from proxy.compacting.decision.history import History, ListHistory, raw_tokens
from proxy.compacting.decision.records import folded_range, record_compaction
from proxy.compacting.decision.request import Decision, ParsedRequest
from proxy.compacting.decision.thinking import BoundThinking
from proxy.compacting.models.llm_client import LLMFactory, NativeCompactor, Prefix
from proxy.metrics import CompactionMetrics
from proxy.recall import Recall
from proxy.settings import CompactionSection, ModelsSettings
from proxy.state.roles import Cooldowns, ForwardedMarks, Leases
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

_OWN_COMPACTION_ITEM_BYTES = 64 * 1024
"""A compaction the client runs itself ends with its prompt (Codex's handoff, Claude Code's
summary request) or a trigger item: a few KB. A longer last item is none, and is not parsed on
every request of a long turn to find out (a 400 KB turn parsed each time cost the proxy 40% more
CPU per request in bench.wrk)."""


@dataclass(frozen=True)
class Choice:
    """What a request's history calls for: its estimate (`before`), the checkpoint the view to
    forward builds on (`base`, None: the history as sent) and that view's estimate (`after`),
    and whether a compaction must run first (`compacts`: over the trigger, no view that fits)."""

    before: int
    base: Checkpoint | None
    after: int
    compacts: bool = False
    stepped_aside: str | None = None
    """Why the request goes as sent whatever its size: a compaction its client or provider
    runs itself (`Conversations.steps_aside`)."""


# Why a request waited for a compaction (its record's `waited`).
_WAITED_OFF = "nothing is prepared ahead: compaction.precompute_ratio is 0"
_WAITED_NOTHING = (
    "nothing was prepared ahead: no earlier request of this conversation came within the "
    "precompute lead of its trigger (it grew past both in one step, or it is new here)"
)
_WAITED_GREW = (
    "the view on the latest checkpoint is still over the trigger: the conversation grew more "
    "than the precompute lead since it was prepared"
)
_WAITED_RUNNING = "the compaction prepared ahead was not ready, or left a view over the trigger"
_WAITED_OVERFLOW = "the upstream refused the request as too long"


@dataclass(frozen=True)
class Deadline:
    """The waits of one request, from its arrival (Conversations.deadline): in the pool (a long
    body indexed, a plan) and for a summary until `summary` (`summary_timeout_s` after it
    arrived); a plan, whose fallback needs one, at least GRACE_S after it arrived (`plan`); and
    in all, the fallback's grace included, until GRACE_S after `summary`."""

    summary: float
    plan: float
    clock: Callable[[], float]

    def left(self) -> float:
        """How long the request may still wait in the pool or for a summary (0: no longer)."""
        return max(0.0, self.summary - self.clock())

    def left_to_plan(self) -> float:
        return max(0.0, self.plan - self.clock())

    def left_in_all(self) -> float:
        """How long the summary built by code may still take (at most GRACE_S)."""
        return min(GRACE_S, max(0.0, self.summary + GRACE_S - self.clock()))


class Conversations:
    def __init__(
        self,
        options: CompactionSection,
        *,
        compactor: Compactor,
        store: CheckpointStore,
        leases: Leases,
        cooldowns: Cooldowns,
        marks: ForwardedMarks,
        llm_for: LLMFactory,
        records: SessionRecords,
        metrics: CompactionMetrics,
        tasks: BackgroundTasks,
        archiving: Archiving | None = None,
        recall: Recall | None = None,
        thinking: BoundThinking | None = None,
        native: NativeCompactor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recall`: what offers compacted requests the recall tool (None: not offered); a
        cached summary request repeats the tool where the view went upstream with it.
        `native`: the provider's own compaction as the summarizer where the dialect has one
        (`compaction.summarizer: native`; None: the text summary everywhere)."""
        self._options = options
        self._native = native
        self._recall = recall
        # Which thinking a compacted view may send back (also read by the hook and exchanges).
        self.thinking = thinking or BoundThinking(ModelsSettings(), options.checkpoint_max_entries)
        self._compactor = compactor
        self._store = store
        self._llm_for = llm_for
        self._records = records
        self._metrics = metrics
        self._clock = clock
        self._archiving = archiving
        self._leases = leases  # single-flight across processes (proxy.state)
        self._cooldowns = cooldowns
        self._flight: SingleFlight[bytes, CompactionResult | Checkpoint] = SingleFlight(tasks)
        # Precomputes still planning, by their request's last digest
        # (proxy.compacting.decision.precompute).
        self.planning: SingleFlight[bytes, None] = SingleFlight(tasks)
        self._reserves = ReserveWrites(compactor, tasks, options.checkpoint_max_entries)
        self._applied = AppliedCompactions(marks, options.checkpoint_max_entries)

    def estimate(self, req: ParsedRequest, history: History, base: Checkpoint | None = None) -> int:
        """The estimate of the view `base` gives of `history` (None: the history as sent): its
        items counted at calibration 1, scaled by the request's calibration, and what the
        request costs besides them."""
        raw = raw_tokens(history, base, req.dialect.shape)
        fixed = req.estimator.count_tools(req.extras) + REPLY_PRIMING_TOKENS
        return round(raw * req.factor) + fixed

    def needs(self, req: ParsedRequest, tokens: int, *, compacted: bool = False) -> bool:
        """True when a request estimated at `tokens` reaches the trigger; a `compacted` view
        goes upstream with the recall tool, which counts too (or a view just under the
        window's end goes out over it once equipped)."""
        tokens += self._recall_tokens(req, compacted)
        return self._compactor.needs_compaction(tokens, req.window, req.max_output_tokens)

    def _recall_tokens(self, req: ParsedRequest, compacted: bool) -> int:
        """What the recall tool adds to a `compacted` view (shadow decides as `on` does)."""
        if not compacted or self._recall is None:
            return 0
        return self._recall.added_tokens(req)

    def fits(self, req: ParsedRequest, tokens: int, *, compacted: bool = False) -> bool:
        """True while a view of `tokens` over the trigger may still go out as it is, its
        compaction running meanwhile (see fit_limit); a `compacted` view with its recall
        tool."""
        return tokens + self._recall_tokens(req, compacted) <= fit_limit(self._options, req)

    async def decide(self, req: ParsedRequest, history: History) -> Choice:
        """The one decision per request, whichever way its history was read (parsed, or
        remembered: proxy.compacting.fast): a compaction the client or the provider runs
        itself goes as sent (`steps_aside`); below the trigger it goes as sent; at the trigger
        the view to forward is chosen (`view`): a checkpoint's view under the trigger, else the
        view as it is while it still fits (its compaction starts in the background:
        proxy.compacting.decision.precompute), else a compaction is called for."""
        if req.dialect.has_thinking:
            await self.thinking.refresh()  # the bound models other processes learned
        before = self.estimate(req, history)
        stepped_aside = self.steps_aside(req, history)
        if stepped_aside is not None:
            self._metrics.stepped_aside(stepped_aside, req.dialect.name).inc()
            return Choice(before, None, before, stepped_aside=stepped_aside)
        if not self.needs(req, before):
            return Choice(before, None, before)
        base, after, _ = await self.view(req, history)
        if base is not None and not self.needs(req, after, compacted=True):
            return Choice(before, base, after)
        return Choice(before, base, after, not self.fits(req, after, compacted=base is not None))

    @staticmethod
    def steps_aside(req: ParsedRequest, history: History) -> str | None:
        """Why `req` is a compaction its client or provider runs itself, which the proxy
        leaves alone whatever its size (Dialect.own_compaction: forwarded byte-identical, no
        recall tool, nothing retried compacted); None when it is not. Read from its fields,
        its headers and its last item only: what a recognized request has too."""
        last = None
        if len(history) and history.item_bytes(len(history) - 1) <= _OWN_COMPACTION_ITEM_BYTES:
            last = history.item(len(history) - 1)
        return req.dialect.own_compaction(req.payload, last, req.headers)

    def deadline(self) -> Deadline:
        """The waits of a request arriving now (see Deadline)."""
        now, summary_s = self._clock(), self._options.summary_timeout_s
        return Deadline(
            summary=now + summary_s, plan=now + max(summary_s, GRACE_S), clock=self._clock
        )

    async def carry_out(
        self, req: ParsedRequest, history: History, choice: Choice, deadline: Deadline | None = None
    ) -> Decision:
        """What `choice` forwards for the parsed request `req`: the request as sent, a view
        that fits (reused), else after waiting for a compaction of this conversation already
        under way (a precompute still planning included), a view that fits then or a compaction
        of the view once more; waiting within `deadline` (taken when the request arrived; None:
        now)."""
        before = choice.before
        if choice.stepped_aside is not None:
            return Decision(
                req.messages, "skipped", before, before, None, stepped_aside=choice.stepped_aside
            )
        if not choice.compacts:
            if choice.base is None:
                return Decision(req.messages, "none", before, before, None)
            return await self._reused(View.of(req.messages, choice.base), before, choice.after)
        if deadline is None:
            deadline = self.deadline()
        digests = history.prefix_digests()
        flight, leases = self._flight, self._leases
        timeout_s = deadline.left()
        if await wait_for_running(flight, leases, digests, timeout_s, starting=self.planning):
            base, tokens, _ = await self.view(req, history)
            if base is not None and not self.needs(req, tokens, compacted=True):
                return await self._reused(View.of(req.messages, base), before, tokens)
            view = View.of(req.messages, base)
            waited = _WAITED_RUNNING
        else:
            view, tokens = View.of(req.messages, choice.base), choice.after
            if not self._options.precompute_ratio:
                waited = _WAITED_OFF
            else:
                waited = _WAITED_NOTHING if choice.base is None else _WAITED_GREW
        return await self._compact_view(
            req, history, view, tokens, before, deadline, "trigger", waited
        )

    async def compact_after_overflow(
        self, req: ParsedRequest, history: ListHistory, before: int
    ) -> Decision:
        """The upstream refused the forwarded view as too long (`req` carries the corrected
        budget, `history` is its list): compact further now. A checkpoint held in reserve is the
        first step; nothing is reused or waited for on the strength of the estimate that just
        proved wrong."""
        deadline = self.deadline()
        base, tokens, reserve = await self.view(req, history)
        if reserve is not None:
            base, tokens = reserve, self.estimate(req, history, reserve)
            await self.flush_reserve(req, reserve)
        view = View.of(req.messages, base)
        return await self._compact_view(
            req, history, view, tokens, before, deadline, "overflow", _WAITED_OVERFLOW
        )

    # -- shared with proxy.compacting.decision.precompute --------------------------------------

    async def view(
        self, req: ParsedRequest, history: History
    ) -> tuple[Checkpoint | None, int, Checkpoint | None]:
        """The checkpoint the view to forward builds on (None: the history as sent), that
        view's estimate, and a precomputed checkpoint still held in reserve.

        A checkpoint prepared ahead of the trigger is used only once the view it extends (its
        parent's, or the original) reaches the trigger: applied earlier, it would move every
        compaction after the first down to the precompute ratio. A reserve that goes out has its
        memory-file items written, if they are not yet (an earlier write may have failed).
        """
        digests = history.prefix_digests()
        # The checkpoint of the longest remembered prefix of the history but its last item.
        newest = await self._store.longest(DigestPrefix(digests, len(history) - 1))
        if newest is None or not newest.precomputed:
            return newest, self.estimate(req, history, newest), None
        parent = await self.stored(digests, newest.parent)
        parent_tokens = self.estimate(req, history, parent)
        if self.needs(req, parent_tokens, compacted=parent is not None):
            await self.flush_reserve(req, newest)
            return newest, self.estimate(req, history, newest), None
        if parent is not None and parent.precomputed:
            await self.flush_reserve(req, parent)
        return parent, parent_tokens, newest

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
        return await is_running(self._flight, self._leases, digests)

    def start(
        self,
        req: ParsedRequest,
        view: View,
        compaction: Compaction,
        digests: Sequence[bytes],
        reason: str,
        *,
        waited: str | None = None,
    ) -> asyncio.Task[CompactionResult | Checkpoint] | None:
        """The (single-flight) summarization carrying out `compaction`, or the checkpoint
        another process stored for it; None if it folds nothing new. `waited`: why a request
        waits for it (its record says so; None: prepared ahead)."""
        key = plan_key(view, compaction.plan, digests)
        if key is None:
            return None
        return self._flight.start(
            key,
            lambda: run_once_everywhere(
                self._leases,
                key,
                lambda: self._summarize(req, view, compaction, digests, reason, waited),
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
        history: History,
        view: View,
        tokens: int,
        before: int,
        deadline: Deadline,
        reason: str,
        waited: str,
    ) -> Decision:
        digests = history.prefix_digests()
        try:  # a stuck worker holds no request past its deadline
            compaction = await asyncio.wait_for(self.plan(req, view), deadline.left_to_plan())
        except (TimeoutError, WorkerLost):  # a worker lost is logged where it was found
            return await self._as_is(view, before, tokens)
        key = plan_key(view, compaction.plan, digests)
        joined = key is not None and key in self._flight
        task = self.start(req, view, compaction, digests, reason, waited=waited)
        if task is None:
            return await self._as_is(view, before, tokens)
        try:
            result = await wait_shielded(task, deadline.left())
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
            result = await fallback(
                self._run(req, compaction, llm=None),
                compaction,
                deadline.left_in_all(),
                session_id=req.session_id,
            )
        if not isinstance(result, Checkpoint) and result.path == "unchanged":
            return await self._as_is(view, before, tokens)
        # "applied": computed for this request, or the first to go out with it (a checkpoint).
        first = await self._applied.add(result.compaction_id)
        status = "applied" if first or not isinstance(result, Checkpoint) else "reused"
        # What goes out may be a reserve: stored by another replica (met through the lease) or
        # by a precompute here that this request joined. Its memory items are due now.
        reserve = result if isinstance(result, Checkpoint) else await self.stored(digests, key)
        if reserve and reserve.precomputed and reserve.compaction_id == result.compaction_id:
            await self.flush_reserve(req, reserve)
        if isinstance(result, Checkpoint):  # compacted for another request, or process
            done = View.of(req.messages, result)
            tokens = self.estimate(req, history, result)
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
        return "applied" if await self._applied.is_new(compaction_id) else "reused"

    async def _summarize(
        self,
        req: ParsedRequest,
        view: View,
        compaction: Compaction,
        digests: Sequence[bytes],
        reason: str,
        waited: str | None,
    ) -> CompactionResult:
        summary_model = self._options.summary_model or req.model
        # One tenant's failing key must not cool the summarizer down for everyone.
        cooldown_key = f"{summary_model}\x00{req.tenant.hex()}"
        llm: ChatLLM | None = None
        if await self._cooldowns.is_cooling(cooldown_key):
            self._metrics.cooldown_skips.inc()
        else:
            prefix = self._prefix(req, view, compaction, reason)
            llm = self._llm_for(req.summarizer(summary_model, prefix))
        # A precomputed compaction may never be applied: its memory items wait in its checkpoint.
        flush = reason != "precompute"
        block = await self._native_block(req, view, compaction) if llm is not None else None
        if block is not None:
            result = await self._run(req, compaction, llm=None, flush=flush)
            result = _carrying(req, result, block)
        else:
            result = await self._run(req, compaction, llm=llm, flush=flush)
        if llm is not None and result.path not in ("unchanged", "selective"):
            # "unchanged" says nothing about the summarizer (nothing to fold, or no gain), nor
            # do previews (no call made).
            ok = result.path == "llm"
            await self._cooldowns.record_outcome(cooldown_key, ok=ok)
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
            self._records,
            self._metrics,
            req,
            view,
            result,
            reason=reason,
            checkpoint=checkpoint,
            # What goes out: a reserve is prepared to a target lowered by the growth still to
            # come, and fits the request well before it reaches that target.
            fits=not self.needs(req, result.tokens_after, compacted=True),
            waited=waited,
            mode=self._options.mode,
        )
        return result

    async def _native_block(
        self, req: ParsedRequest, view: View, compaction: Compaction
    ) -> dict[str, Any] | None:
        """The provider's own compaction block over what `compaction` folds of `view`, when the
        summarizer is native and the docs' conditions for the kept turns' thinking hold
        (proxy.dialects.anthropic.native); None: the text summary (no call, or a failed one:
        logged and counted, the text summary follows)."""
        native, plan = req.dialect.native, compaction.plan
        if self._native is None or native is None or not plan.summarize or plan.previews:
            return None
        messages, keep_from = view.messages, plan.keep_from
        if plan.head_end != 0 or not 0 < keep_from < len(messages):
            return None  # a client's own compaction leads: it stays, the text summary follows it
        if view.base is not None and not native.has_native(messages):
            return None  # after a text summary the kept thinking is already bound to it
        shape = req.dialect.shape
        if shape.read(messages[keep_from - 1]).label == shape.read(messages[keep_from]).label:
            return None  # the API would join the first kept turn to the summarized ones
        # An account without the feature (or an endpoint that hangs) fails every time: after
        # `failure_threshold` failures in a row it is not asked for a while, like a summarizer.
        cooldown_key = f"native\x00{req.model}\x00{req.tenant.hex()}"
        if await self._cooldowns.is_cooling(cooldown_key):
            self._metrics.cooldown_skips.inc()
            return None
        folded = req.dialect.wire(messages[:keep_from])
        try:
            # The conversation's own model, whatever `summary_model` says: the kept thinking
            # stays valid only while every compaction ran on a model that preserves it.
            block = await self._native.block(
                req.summarizer(req.model), req.payload, folded, self._options.summary_max_tokens
            )
        except Exception as exc:
            self._metrics.summarizer_failures.inc()
            await self._cooldowns.record_outcome(cooldown_key, ok=False)
            log.warning(
                "native compaction failed; summarizing as text",
                extra={"session": req.session_id, "reason": str(exc)[:200]},
            )
            return None
        await self._cooldowns.record_outcome(cooldown_key, ok=True)
        return block

    def _prefix(
        self, req: ParsedRequest, view: View, compaction: Compaction, reason: str
    ) -> Prefix | None:
        """The request a cached summary request repeats: the view being compacted, as it goes
        (or went) upstream, with the recall tool when it went with it (a compacted view in mode
        `on`). None where the cache cannot help: another summary model (its own cache), or a
        view the upstream refused as too long (`reason` "overflow"). In shadow mode a compacted
        view never went upstream: its one cached question is read from no cache, yet costs
        about what two standalone requests carrying the folded turns would, and asks what
        `on` asks (the shadow's records are the proof of what `on` does)."""
        options = self._options
        if options.summary_request != "cached" or reason == "overflow":
            return None
        if options.summary_model not in (None, req.model):
            return None
        compacted = view.base is not None and options.mode == "on"
        recall = compacted and self._recall is not None and self._recall.offered(req)
        room = req.window - compaction.plan.tokens_before
        if recall and self._recall is not None:
            room -= self._recall.added_tokens(req)  # the question carries the tool too
        # As forwarded: a thinking block whose prefix changed would get the question refused.
        base = view.base.compaction_id if view.base is not None else None
        messages = self.thinking.view(req, view.messages, base)
        return Prefix(req.payload, messages, room, recall=recall)

    async def _run(
        self, req: ParsedRequest, compaction: Compaction, *, llm: ChatLLM | None, flush: bool = True
    ) -> CompactionResult:
        return await compaction.run(llm=llm, session_id=req.session_id, flush_memory=flush)

    async def flush_reserve(self, req: ParsedRequest, reserve: Checkpoint) -> None:
        """A precomputed checkpoint goes out: its memory items are due now, if not yet written
        (proxy.compacting.background.reserve_writes)."""
        await self._reserves.flush(req.session_id, reserve)

    async def stored(self, digests: Sequence[bytes], key: bytes | None) -> Checkpoint | None:
        return await stored_under(self._store, digests, key)


def fit_limit(options: CompactionSection, req: ParsedRequest) -> int:
    """The largest estimate at which a request over the trigger still goes out as it is while
    its compaction runs: `fit_ratio` of the window, and its `max_tokens` within the window;
    below the trigger when `fit_ratio` is None (every request at the trigger waits for its
    compaction). The trigger is where a compaction starts, this is where it must apply: a
    conversation that ends in between never pays for a summary, one that goes on finds it
    ready, and no request waits unless it would no longer fit."""
    if options.fit_ratio is None:
        return -1
    limit = int(options.fit_ratio * req.window)
    if req.max_output_tokens is not None:
        limit = min(limit, room_for_prompt(req.window, req.max_output_tokens))
    return limit


def _carrying(
    req: ParsedRequest, result: CompactionResult, block: dict[str, Any]
) -> CompactionResult:
    """`result` with the block in its summary's place and nothing between it and the kept
    turns (no pinned turn): what the checkpoint keeps, and the wire sends as the block
    (proxy.dialects.anthropic.native). The message that carries it is the block's own text as
    a summary, so the estimate counts what goes upstream, and a text fallback or the next
    compaction reads it."""
    native = req.dialect.native
    summary = result.summary_message
    if native is None or summary is None or result.path == "unchanged":
        return result
    text = block.get("content")
    framed = summary_message(text if isinstance(text, str) else "", req.dialect.shape)
    carried = native.carrying(framed, block)
    prefix = result.messages[: result.prefix_len]
    at = next((i for i, m in enumerate(prefix) if m is summary), None)
    if at is None:  # no summary in the prefix to stand for: the text summary stays
        return result
    kept = result.messages[result.prefix_len :]
    replaced = sum(req.estimator.count_messages(prefix[at:]))
    tokens_after = result.tokens_after - replaced + sum(req.estimator.count_messages([carried]))
    return replace(
        result,
        messages=[*prefix[:at], carried, *kept],
        prefix_len=at + 1,
        summary_message=carried,
        summary_text=framed["content"],
        tokens_after=tokens_after,
        path="llm",
        verification=None,  # what code checked was its own summary, not the block
    )


async def stored_under(
    store: CheckpointStore, digests: Sequence[bytes], key: bytes | None
) -> Checkpoint | None:
    """The checkpoint stored under `key`, one of `digests` (a conversation's parent or reserve);
    None if there is none (any more)."""
    if key is None:
        return None
    try:
        cut = digests.index(key) + 1
    except ValueError:
        return None
    found = await store.longest(digests[:cut])
    return found if found is not None and found.key == key else None
