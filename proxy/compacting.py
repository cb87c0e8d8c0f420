"""The compacting chat pipeline: the proxy's per-request compaction decision.

Below the trigger the original bytes go upstream untouched. At the trigger the longest remembered
checkpoint of the conversation is substituted (byte-stable prefix), and only if that is still too
large is the conversation compacted further, once, however many requests wait for it. Past the
lower precompute ratio the next checkpoint is prepared in the background after forwarding, so in
steady state no request waits for the summarizer. Anything that fails here forwards a request that
still fits (the library's fallback) or the original; it never fails the agent's request.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from cachetools import LRUCache

from compaction import Compactor, CompactionResult, HeuristicEstimator, MemoryWriter, Plan
from compaction import CompactionSettings as LibrarySettings
from compaction.checkpoints import (
    Checkpoint,
    CheckpointStore,
    MemoryCheckpointStore,
    View,
    checkpoint_after,
    conversation_seed,
    find_longest,
    prefix_digests,
)
from proxy import keys
from proxy.calibration import Calibration
from proxy.chat import ChatRequest, NotAChat, max_output_of, may_need_parsing, model_of
from proxy.cooldown import Cooldown
from proxy.flight import SingleFlight, wait_shielded
from proxy.metrics import CompactionMetrics
from proxy.overflow import parse_overflow
from proxy.pipeline import ChatContext, Prepared
from proxy.records import SessionRecords
from proxy.sessions import fingerprint
from proxy.settings import Settings
from proxy.summarizer import UpstreamLLM
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

STATUS = "x-compaction-status"
TOKENS_BEFORE = "x-compaction-tokens-before"
TOKENS_AFTER = "x-compaction-tokens-after"
COMPACTION_ID = "x-compaction-id"
SESSION = "x-compaction-session"

# Headers that identify the caller to the upstream besides Authorization (Azure-style keys,
# OpenAI organisation and project): they go with the proxy's own summary calls and scope reuse.
_AUTH_HEADERS = ("api-key", "x-api-key", "OpenAI-Organization", "OpenAI-Project")
# After an overflow without numbers, assume we under-counted by this much.
_OVERFLOW_BUMP = 1.25
# Aim this far under an overflow's stated limit on the retry.
_OVERFLOW_MARGIN = 0.9
# How much longer than a waiting request the summarizer call itself may take.
_BACKGROUND_TIMEOUT_FACTOR = 3
# How much of each summary the admin records show.
_PREVIEW_CHARS = 400


@dataclass
class Forwarded:
    """What went upstream last for one request: the retry replaces it, calibration reads it."""

    chat: ChatRequest
    tokens: int
    body: bytes
    retried: bool = False


@dataclass(frozen=True)
class ChatPrepared(Prepared):
    """What `prepare` decided, with what the retry and the calibration need later."""

    forwarded: Forwarded | None = None


@dataclass(frozen=True)
class _Decision:
    messages: list[Any]
    status: str
    tokens_before: int
    tokens_after: int
    compaction_id: str | None


class CompactingPipeline:
    def __init__(
        self,
        settings: Settings,
        *,
        client: Callable[[], aiohttp.ClientSession],
        compactor: Compactor,
        store: CheckpointStore,
        records: SessionRecords,
        metrics: CompactionMetrics,
        tasks: BackgroundTasks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._options = settings.compaction
        self._client = client
        self._compactor = compactor
        self._store = store
        self._records = records
        self._metrics = metrics
        self._tasks = tasks
        self._clock = clock
        self._flight: SingleFlight[bytes, CompactionResult] = SingleFlight(tasks)
        self._cooldown = Cooldown(self._options.failure_threshold, self._options.failure_cooldown_s, clock)
        self.calibration = Calibration()
        # Per conversation: a raw-estimate range [from, to) in which a precompute has been shown
        # to find nothing to do (a shorter, edited or other conversation falls outside it).
        self._quiet: LRUCache[bytes, tuple[int, int]] = LRUCache(self._options.checkpoint_max_entries)
        models = settings.models
        self._smallest_window = min([models.default_context_window, *models.context_windows.values()])

    # -- the ChatPipeline protocol -------------------------------------------------------------

    async def prepare(self, ctx: ChatContext, body: bytes) -> Prepared:
        if not self._options.enabled or not self._may_reach(body):
            return Prepared(body=body, headers={STATUS: "none"}, session_id=ctx.session_id)
        try:
            chat = self._parse(ctx, body)
        except NotAChat:
            return Prepared(body=body, headers={STATUS: "none"}, session_id=ctx.session_id)
        try:
            return await self._prepare_chat(ctx, body, chat)
        except Exception:  # fail open: the agent's request always goes through
            log.exception("compaction failed; forwarding the original request")
            self._metrics.errors.inc()
            return Prepared(
                body=body, headers={STATUS: "failed", SESSION: chat.session_id},
                session_id=chat.session_id,
            )

    async def on_upstream_error(
        self, ctx: ChatContext, prepared: Prepared, status: int, body: bytes
    ) -> bytes | None:
        forwarded = prepared.forwarded if isinstance(prepared, ChatPrepared) else None
        if forwarded is None or forwarded.retried:
            return None
        overflow = parse_overflow(status, body)
        if overflow is None:
            return None
        chat = forwarded.chat
        raw_forwarded = forwarded.tokens / chat.factor
        if overflow.requested and raw_forwarded > 0:
            factor = self.calibration.raise_at_least(chat.model, overflow.requested / raw_forwarded)
        else:
            factor = self.calibration.raise_at_least(chat.model, chat.factor * _OVERFLOW_BUMP)
        window = chat.window
        if overflow.limit:
            # A stated limit below ours is believed, but never shrinks the budget past half.
            window = max(min(window, int(overflow.limit * _OVERFLOW_MARGIN)), window // 2)
        harder = chat.with_budget(window=window, factor=factor)
        self._metrics.overflow_retries.inc()
        try:
            before = self._estimate(harder, harder.messages)
            decision = await self._compact(harder, before, reason="overflow", force=True)
        except Exception:
            log.exception("compaction after a context-length error failed")
            self._metrics.errors.inc()
            return None
        retry = harder.serialize(decision.messages)
        if decision.status not in ("applied", "reused") or len(retry) >= len(forwarded.body):
            return None  # nothing smaller to send: relay the upstream's error
        forwarded.chat, forwarded.tokens, forwarded.body = harder, decision.tokens_after, retry
        forwarded.retried = True
        log.info("upstream reported a context overflow; retrying once compacted",
                 extra={"session": chat.session_id, "tokens_after": decision.tokens_after})
        return retry

    def on_response(
        self, ctx: ChatContext, prepared: Prepared, status: int, usage: dict[str, Any] | None
    ) -> None:
        forwarded = prepared.forwarded if isinstance(prepared, ChatPrepared) else None
        if status != 200 or forwarded is None:
            return
        prompt_tokens = (usage or {}).get("prompt_tokens")
        if isinstance(prompt_tokens, int) and forwarded.tokens > 0:
            chat = forwarded.chat
            self.calibration.observe(chat.model, round(forwarded.tokens / chat.factor), prompt_tokens)

    # -- deciding ----------------------------------------------------------------------------

    def _may_reach(self, body: bytes) -> bool:
        ratio = min(self._options.precompute_ratio or 1.0, self._options.trigger_ratio)
        factor = self.calibration.max_factor
        return may_need_parsing(
            body, smallest_window=self._smallest_window, lowest_ratio=ratio, factor=factor
        )

    def _parse(self, ctx: ChatContext, body: bytes) -> ChatRequest:
        payload, messages = ChatRequest.parse(body)
        model = model_of(payload)
        auth = {name: ctx.headers[name] for name in _AUTH_HEADERS if name in ctx.headers}
        tenant = conversation_seed(ctx.credential or "", *auth.values())
        session_id = ctx.session_id or fingerprint(payload)
        factor = self.calibration.factor(model)
        return ChatRequest(
            payload=payload,
            messages=messages,
            tools=payload.get("tools"),
            model=model,
            window=self._settings.models.context_window_for(model),
            max_output_tokens=max_output_of(payload),
            session_id=session_id,
            credential=ctx.credential,
            auth_headers=auth,
            tenant=tenant,
            seed=conversation_seed(tenant.hex(), session_id),
            factor=factor,
            estimator=HeuristicEstimator(factor),
        )

    def _estimate(self, chat: ChatRequest, messages: list[Any]) -> int:
        return self._compactor.estimate(messages, chat.tools, estimator=chat.estimator)

    def _needs(self, chat: ChatRequest, tokens: int) -> bool:
        return self._compactor.needs_compaction(tokens, chat.window, chat.max_output_tokens)

    async def _prepare_chat(self, ctx: ChatContext, body: bytes, chat: ChatRequest) -> Prepared:
        tokens = self._estimate(chat, chat.messages)
        if self._needs(chat, tokens):
            decision = await self._compact(chat, tokens, reason="trigger")
        else:
            decision = _Decision(chat.messages, "none", tokens, tokens, None)
        self._metrics.decisions.labels(status=decision.status).inc()
        if decision.tokens_after >= self._precompute_at(chat) and not self._is_quiet(chat, tokens):
            self._spawn(self._precompute(chat, tokens), name=f"precompute:{chat.session_id}")
        headers = {
            STATUS: decision.status,
            SESSION: chat.session_id,
            TOKENS_BEFORE: str(decision.tokens_before),
            TOKENS_AFTER: str(decision.tokens_after),
        }
        if decision.compaction_id:
            headers[COMPACTION_ID] = decision.compaction_id
        forwarded = chat.serialize(decision.messages) if decision.messages is not chat.messages else body
        return ChatPrepared(
            body=forwarded,
            headers=headers,
            session_id=chat.session_id,
            wants_usage=True,
            forwarded=Forwarded(chat, decision.tokens_after, forwarded),
        )

    async def _compact(
        self, chat: ChatRequest, before: int, *, reason: str, force: bool = False
    ) -> _Decision:
        deadline = self._clock() + self._options.summary_timeout_s
        digests = prefix_digests(chat.messages, chat.seed)
        view, tokens, reserve = self._view(chat, digests)
        if force and reserve is not None:
            view = View.of(chat.messages, reserve)
            tokens = self._estimate(chat, view.messages)
        if view.base is not None and not force and not self._needs(chat, tokens):
            self._metrics.checkpoint_hits.inc()
            return _Decision(view.messages, "reused", before, tokens, view.base.compaction_id)
        pending = self._flight.find(reversed(digests))
        if pending is not None and not force:
            # A compaction of this conversation is under way (a precompute, or a concurrent
            # request): wait for it rather than summarize the same history again.
            try:
                await wait_shielded(pending, max(0.0, deadline - self._clock()))
            except TimeoutError:
                pass
            view, tokens, _ = self._view(chat, digests)
            if view.base is not None and not self._needs(chat, tokens):
                self._metrics.checkpoint_hits.inc()
                return _Decision(view.messages, "reused", before, tokens, view.base.compaction_id)
        plan = self._compactor.plan(
            view.messages, window=chat.window, tools=chat.tools,
            max_output_tokens=chat.max_output_tokens, estimator=chat.estimator,
        )
        key = self._key(view, plan, digests)
        if key is None:
            status = "reused" if view.base is not None else "failed"
            return _Decision(view.messages, status, before, tokens, None)
        task = self._flight.start(
            key, lambda: self._summarize(chat, view, plan, digests, reason),
            name=f"compact:{chat.session_id}",
        )
        try:
            result = await wait_shielded(task, max(0.0, deadline - self._clock()))
        except TimeoutError:
            # The summarization goes on and records its checkpoint for the next request; this
            # one goes out now on the fallback path (no memory flush: the summarization does it).
            self._metrics.summary_timeouts.inc()
            result = await self._compactor.run(
                view.messages, plan, llm=None, session_id=None, tools=chat.tools, estimator=chat.estimator
            )
        if result.path == "unchanged":
            return _Decision(view.messages, "failed", before, tokens, None)
        return _Decision(result.messages, "applied", before, result.tokens_after, result.compaction_id)

    def _view(self, chat: ChatRequest, digests: list[bytes]) -> tuple[View, int, Checkpoint | None]:
        """The view to forward, its tokens, and a precomputed checkpoint still held in reserve.

        A checkpoint prepared ahead of the trigger is used only once the view it extends (its
        parent's, or the original) reaches the trigger: applied earlier, it would move every
        compaction after the first down to the precompute ratio.
        """
        newest = find_longest(self._store, digests)
        view = View.of(chat.messages, newest)
        if newest is None or not newest.precomputed:
            return view, self._estimate(chat, view.messages), None
        parent = self._store.get(newest.parent) if newest.parent is not None else None
        parent_view = View.of(chat.messages, parent)
        parent_tokens = self._estimate(chat, parent_view.messages)
        if self._needs(chat, parent_tokens):
            return view, self._estimate(chat, view.messages), None
        return parent_view, parent_tokens, newest

    @staticmethod
    def _key(view: View, plan: Plan, digests: list[bytes]) -> bytes | None:
        """The checkpoint key the plan would produce; None when it folds nothing new."""
        if plan.keep_from <= plan.head_end or not plan.folded:
            return None
        if view.base is not None and plan.keep_from < view.base.prefix_len:
            return None
        cut = view.original_index(plan.keep_from)
        if cut is None or not 0 < cut <= len(digests):
            return None
        return digests[cut - 1]

    def _precompute_at(self, chat: ChatRequest) -> float:
        ratio = self._options.precompute_ratio
        return ratio * chat.window if ratio else float("inf")

    def _is_quiet(self, chat: ChatRequest, raw_tokens: int) -> bool:
        """True while an earlier check of this conversation proved a precompute pointless."""
        quiet = self._quiet.get(_conversation_key(chat))
        return quiet is not None and quiet[0] <= raw_tokens < quiet[1]

    def _spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        if self._tasks.closed:  # shutting down: no new background work
            coro.close()
            return
        self._tasks.spawn(coro, name=name)

    async def _precompute(self, chat: ChatRequest, raw_tokens: int) -> None:
        """Prepare the conversation's next checkpoint before a request needs it."""
        digests = prefix_digests(chat.messages, chat.seed)
        if self._flight.find(digests) is not None:
            return
        view, tokens, reserve = self._view(chat, digests)
        if reserve is not None:
            # The next checkpoint is ready; nothing to do until the view reaches the trigger.
            self._quiet[_conversation_key(chat)] = (raw_tokens, raw_tokens + int(
                self._options.trigger_ratio * chat.window - tokens))
            return
        threshold = self._precompute_at(chat)
        if tokens < threshold:
            # History only grows: nothing to do until the view grows past the threshold.
            self._quiet[_conversation_key(chat)] = (raw_tokens, raw_tokens + int(threshold - tokens))
            return
        plan = self._compactor.plan(
            view.messages, window=chat.window, tools=chat.tools,
            max_output_tokens=chat.max_output_tokens, estimator=chat.estimator,
        )
        key = self._key(view, plan, digests)
        if key is None or self._store.get(key) is not None:
            return
        self._flight.start(
            key, lambda: self._summarize(chat, view, plan, digests, "precompute"),
            name=f"precompute-run:{chat.session_id}",
        )

    async def _summarize(
        self, chat: ChatRequest, view: View, plan: Plan, digests: list[bytes], reason: str
    ) -> CompactionResult:
        summary_model = self._options.summary_model or chat.model
        # One tenant's failing key must not cool the summarizer down for everyone.
        cooldown_key = f"{summary_model}\x00{chat.tenant.hex()}"
        llm: UpstreamLLM | None = None
        if self._cooldown.is_cooling(cooldown_key):
            self._metrics.cooldown_skips.inc()
        else:
            llm = UpstreamLLM(
                self._client(),
                self._settings.upstream.base_url,
                model=summary_model,
                credential=chat.credential,
                client_headers=chat.auth_headers,
                timeout_s=self._compactor.settings.llm_timeout_s,
            )
        result = await self._compactor.run(
            view.messages, plan, llm=llm, session_id=chat.session_id,
            tools=chat.tools, estimator=chat.estimator,
        )
        if llm is not None and result.path != "unchanged":
            # "unchanged" says nothing about the summarizer (nothing to fold, or no gain).
            ok = result.path == "llm"
            self._cooldown.record(cooldown_key, ok=ok)
            self._metrics.summarizer_seconds.observe(result.duration_s)
            if not ok:
                self._metrics.summarizer_failures.inc()
        checkpoint = checkpoint_after(view, result, digests, precomputed=reason == "precompute")
        if checkpoint is not None:
            self._store.put(checkpoint)
        self._record(chat, view, result, reason, checkpoint)
        return result

    def _record(
        self, chat: ChatRequest, view: View, result: CompactionResult, reason: str,
        checkpoint: Checkpoint | None,
    ) -> None:
        self._metrics.compactions.labels(reason=reason, path=result.path).inc()
        if result.path != "unchanged":
            self._metrics.tokens_saved.inc(max(0, result.tokens_before - result.tokens_after))
        verification = result.verification
        self._records.add_record(chat.session_id, {
            "id": result.compaction_id,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "reason": reason,
            "path": result.path,
            "detail": result.reason,
            "model": chat.model,
            "window": chat.window,
            "messages_before": len(view.messages),
            "messages_after": len(result.messages),
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "folded_messages": result.folded_count,
            "folded_range": _folded_range(view, checkpoint),
            "extends": view.base.compaction_id if view.base else None,
            "summary_chars": len(result.summary_text),
            "summary_preview": result.summary_text[:_PREVIEW_CHARS],
            "memory_items": len(result.memory_items),
            "quality": verification.quality if verification else None,
            "key_decisions_preserved": verification.key_decisions_preserved if verification else None,
            "key_decisions_total": verification.key_decisions_total if verification else None,
            "fits": result.fits,
            "duration_ms": round(result.duration_s * 1000, 1),
            "errors": list(result.errors),
        })
        log.info(
            "compaction %s", result.path,
            extra={"session": chat.session_id, "reason": reason, "tokens_before": result.tokens_before,
                   "tokens_after": result.tokens_after, "compaction_id": result.compaction_id},
        )


def _conversation_key(chat: ChatRequest) -> bytes:
    """One conversation of one caller: its seed and the fingerprint of its opening."""
    return chat.seed + fingerprint(chat.payload).encode()


def _folded_range(view: View, checkpoint: Checkpoint | None) -> list[int] | None:
    """Original message indices [start, end) this compaction folded for the first time."""
    if checkpoint is None:
        return None
    start = view.base.cut if view.base is not None else checkpoint.head_end
    return [start, checkpoint.cut]


def create_pipeline(app: web.Application, tasks: BackgroundTasks) -> CompactingPipeline:
    """The app's compacting pipeline, configured from its settings (see app.create_app)."""
    settings = app[keys.SETTINGS]
    options = settings.compaction
    compactor = Compactor(
        settings=LibrarySettings(
            trigger_ratio=options.trigger_ratio,
            target_ratio=options.target_ratio,
            keep_recent_rounds=options.keep_recent_rounds,
            summary_max_tokens=options.summary_max_tokens,
            # A request stops waiting after summary_timeout_s; the summarization itself may go
            # on a while longer in the background and still record its checkpoint.
            llm_timeout_s=options.summary_timeout_s * _BACKGROUND_TIMEOUT_FACTOR,
        ),
        memory=MemoryWriter(settings.memory.dir),
    )
    return CompactingPipeline(
        settings,
        client=lambda: app[keys.UPSTREAM].session,
        compactor=compactor,
        store=MemoryCheckpointStore(options.checkpoint_max_entries, options.checkpoint_ttl_s),
        records=app[keys.RECORDS],
        metrics=app[keys.METRICS].compaction,
        tasks=tasks,
    )
