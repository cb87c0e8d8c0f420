"""The compacting chat pipeline: the proxy's per-request compaction decision.

Bodies that cannot reach the lowest ratio are not parsed; below the trigger the original bytes go
upstream untouched. At the trigger the conversation's compactions (proxy.compacting.conversations) give the
view to forward: a remembered checkpoint, or a new compaction. Here also: the informational
headers, the one retry after a context-length error, and calibration from upstream usage.
Anything that fails here forwards the original request; it never fails the agent's request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from compaction import CompactionSettings as LibrarySettings
from compaction import Compactor, HeuristicEstimator, MemoryWriter
from compaction.checkpoints import (
    MemoryCheckpointStore,
    conversation_seed,
)
from proxy import keys
from proxy.compacting.calibration import Calibration
from proxy.compacting.chat import (
    ChatRequest,
    NotAChat,
    fingerprint,
    max_output_of,
    may_need_parsing,
    model_of,
)
from proxy.compacting.conversations import Compactions, Decision
from proxy.compacting.overflow import parse_overflow
from proxy.hook import ChatContext, Prepared
from proxy.metrics import CompactionMetrics
from proxy.settings import Settings
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


class CompactingPipeline:
    def __init__(
        self, settings: Settings, *, compactions: Compactions, metrics: CompactionMetrics
    ) -> None:
        self._settings = settings
        self._options = settings.compaction
        self._compactions = compactions
        self._metrics = metrics
        self.calibration = Calibration()
        models = settings.models
        self._smallest_window = min(
            [models.default_context_window, *models.context_windows.values()]
        )

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
                body=body,
                headers={STATUS: "failed", SESSION: chat.session_id},
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
            before = self._compactions.estimate(harder, harder.messages)
            decision = await self._compactions.compact(
                harder, before, reason="overflow", force=True
            )
        except Exception:
            log.exception("compaction after a context-length error failed")
            self._metrics.errors.inc()
            return None
        retry = harder.serialize(decision.messages)
        if decision.status not in ("applied", "reused") or len(retry) >= len(forwarded.body):
            return None  # nothing smaller to send: relay the upstream's error
        forwarded.chat, forwarded.tokens, forwarded.body = harder, decision.tokens_after, retry
        forwarded.retried = True
        log.info(
            "upstream reported a context overflow; retrying once compacted",
            extra={"session": chat.session_id, "tokens_after": decision.tokens_after},
        )
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
            self.calibration.observe(
                chat.model, round(forwarded.tokens / chat.factor), prompt_tokens
            )

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
        opening = fingerprint(payload)
        session_id = ctx.session_id or opening
        factor = self.calibration.factor(model)
        return ChatRequest(
            payload=payload,
            messages=messages,
            tools=payload.get("tools"),
            model=model,
            window=self._settings.models.context_window_for(model),
            max_output_tokens=max_output_of(payload),
            session_id=session_id,
            opening=opening,
            credential=ctx.credential,
            auth_headers=auth,
            tenant=tenant,
            seed=conversation_seed(tenant.hex(), session_id),
            factor=factor,
            estimator=HeuristicEstimator(factor),
        )

    async def _prepare_chat(self, ctx: ChatContext, body: bytes, chat: ChatRequest) -> Prepared:
        tokens = self._compactions.estimate(chat, chat.messages)
        if self._compactions.needs(chat, tokens):
            decision = await self._compactions.compact(chat, tokens, reason="trigger")
        else:
            decision = Decision(chat.messages, "none", tokens, tokens, None)
        self._metrics.decisions.labels(status=decision.status).inc()
        self._compactions.prepare_next(chat, decision.tokens_after, tokens)
        headers = {
            STATUS: decision.status,
            SESSION: chat.session_id,
            TOKENS_BEFORE: str(decision.tokens_before),
            TOKENS_AFTER: str(decision.tokens_after),
        }
        if decision.compaction_id:
            headers[COMPACTION_ID] = decision.compaction_id
        forwarded = (
            chat.serialize(decision.messages) if decision.messages is not chat.messages else body
        )
        return ChatPrepared(
            body=forwarded,
            headers=headers,
            session_id=chat.session_id,
            wants_usage=True,
            forwarded=Forwarded(chat, decision.tokens_after, forwarded),
        )


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
    metrics = app[keys.METRICS].compaction
    compactions = Compactions(
        options,
        upstream_url=settings.upstream.base_url,
        client=lambda: app[keys.UPSTREAM].session,
        compactor=compactor,
        store=MemoryCheckpointStore(options.checkpoint_max_entries, options.checkpoint_ttl_s),
        records=app[keys.RECORDS],
        metrics=metrics,
        tasks=tasks,
    )
    return CompactingPipeline(settings, compactions=compactions, metrics=metrics)
