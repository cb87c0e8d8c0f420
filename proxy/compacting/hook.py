"""The compacting hook: the proxy's per-request compaction decision (proxy.hook.Hook).

Bodies that cannot reach the lowest ratio are not parsed; below the trigger the original bytes go
upstream untouched. At the trigger the conversations (proxy.compacting.conversations) give the
view to forward: a remembered checkpoint, or a new compaction. Each hooked route has its dialect
(proxy.compacting.dialects); a parsed request becomes a CompactedExchange
(proxy.compacting.exchange), which owns the retry and the calibration.
Anything that fails here forwards the original request; it never fails the agent's request.
"""

from __future__ import annotations

import logging
from typing import Any

from compaction import Compactor, HeuristicEstimator, MemoryWriter
from compaction.checkpoints import CheckpointStore, conversation_seed
from compaction.offload import Offload
from proxy.compacting.calibration import Calibration
from proxy.compacting.conversations import Conversations
from proxy.compacting.dialects import Dialect, NotCompactable, for_route
from proxy.compacting.exchange import (
    SESSION,
    STATUS,
    CompactedExchange,
    UnparsedExchange,
    describe,
)
from proxy.compacting.known import Known, KnownRequests, splice_view, view_parts
from proxy.compacting.llm_client import LLMFactory, UpstreamLLMFactory
from proxy.compacting.overflow import LearnedWindows, parse_overflow
from proxy.compacting.precompute import Precompute
from proxy.compacting.recall import Recall, estimate_known
from proxy.compacting.request import (
    Decision,
    ParsedRequest,
    fingerprint,
    may_need_parsing,
    model_of,
)
from proxy.compacting.stores.backend import StateBackend
from proxy.compacting.stores.memory import MemoryStore
from proxy.hook import Exchange, Passthrough, RequestContext
from proxy.http.sessions import SessionRecords
from proxy.http.upstream import Upstream
from proxy.metrics import CompactionMetrics
from proxy.settings import Settings
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

# Headers that identify the caller to the upstream besides Authorization (Azure-style keys,
# OpenAI organisation and project): they go with the proxy's own summary calls and scope reuse.
_AUTH_HEADERS = ("api-key", "x-api-key", "OpenAI-Organization", "OpenAI-Project")
# How much longer than a waiting request the summarizer call itself may take.
_BACKGROUND_TIMEOUT_FACTOR = 3
# Below this a body is parsed whole in well under a millisecond: not worth remembering.
_KNOWN_MIN_BODY_BYTES = 64 * 1024


class CompactingHook:
    def __init__(
        self,
        settings: Settings,
        *,
        conversations: Conversations,
        precompute: Precompute,
        metrics: CompactionMetrics,
        known: KnownRequests | None = None,
    ) -> None:
        self._settings = settings
        self._options = settings.compaction
        self._conversations = conversations
        self._precompute = precompute
        self._metrics = metrics
        self.calibration = Calibration()
        self.learned = LearnedWindows()
        self._recall = Recall(
            known or KnownRequests(max_bytes=0, min_body_bytes=0),
            conversations=conversations,
            precompute=precompute,
            metrics=metrics,
            calibration=self.calibration,
            learned=self.learned,
        )
        models = settings.models
        self._smallest_window = min(
            [models.default_context_window, *models.context_windows.values()]
        )

    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        untouched = Passthrough(
            body=body, headers={STATUS: "none"}, session_id=ctx.explicit_session
        )
        dialect = for_route(ctx.route)
        if dialect is None or not self._options.enabled:
            return untouched
        if not self._may_reach(body):
            # Not parsed; but should the upstream refuse it as too long, the window we assumed
            # is wrong: parse it then, compact and retry (see _retry_unparsed).
            return UnparsedExchange(
                untouched,
                lambda status, error: self._retry_unparsed(ctx, dialect, body, status, error),
            )
        # Long conversations are remembered; for now in the chat dialect only.
        key = self._recall.key(ctx, body) if dialect.name == "chat" else None
        known = None
        if key is not None:
            recalled, known = await self._recall.recall(
                key,
                body,
                lambda fields, opening, fp: self._request_of(
                    ctx, dialect, body, fields, [], opening, fp
                ),
                lambda: self._parse(ctx, dialect, body),
            )
            if recalled is not None:
                return recalled
        try:
            request = self._parse(ctx, dialect, body)
        except NotCompactable:
            return untouched
        if key is not None and known is None:
            known = await self._recall.learn(key, body, request)
        try:
            return await self._prepare(body, request, known)
        except Exception:  # fail open: the agent's request always goes through
            log.exception("compaction failed; forwarding the original request")
            self._metrics.errors.inc()
            return Passthrough(
                body=body,
                headers={STATUS: "failed", SESSION: request.session_id},
                session_id=request.session_id,
            )

    # -- deciding ----------------------------------------------------------------------------

    def _may_reach(self, body: bytes) -> bool:
        ratio = min(self._options.precompute_ratio or 1.0, self._options.trigger_ratio)
        factor = self.calibration.max_factor
        smallest = min(self._smallest_window, self.learned.smallest() or self._smallest_window)
        return may_need_parsing(body, smallest_window=smallest, lowest_ratio=ratio, factor=factor)

    async def _retry_unparsed(
        self, ctx: RequestContext, dialect: Dialect, body: bytes, status: int, error: bytes
    ) -> CompactedExchange | None:
        """An exchange that retried the unparsed request `body` after the upstream's
        context-length `error`, or None (not an overflow, nothing to compact, nothing to retry
        with)."""
        if parse_overflow(status, error) is None:
            return None
        try:
            request = self._parse(ctx, dialect, body)
        except NotCompactable:
            return None
        tokens = self._conversations.estimate(request, request.messages)
        unchanged = Decision(request.messages, "none", tokens, tokens, None)
        exchange = self._exchange(body, request, unchanged)
        return exchange if await exchange.retry_after_error(status, error) else None

    def _parse(self, ctx: RequestContext, dialect: Dialect, body: bytes) -> ParsedRequest:
        payload, messages = dialect.parse(body)
        return self._request_of(ctx, dialect, body, payload, messages, messages, None)

    def _request_of(
        self,
        ctx: RequestContext,
        dialect: Dialect,
        body: bytes,
        payload: dict[str, Any],
        messages: list[Any],
        opening_messages: list[Any],
        opening: str | None,
    ) -> ParsedRequest:
        """The request from its payload; `opening_messages` holds at least its messages up to
        the first user message (all a fingerprint reads); `opening`, their fingerprint if known."""
        model = model_of(payload)
        auth = {name: ctx.headers[name] for name in _AUTH_HEADERS if name in ctx.headers}
        tenant = conversation_seed(ctx.credential or "", *auth.values())
        # Headers the summary call needs but that do not name the caller (anthropic-version).
        auth.update(
            {name: ctx.headers[name] for name in dialect.call_headers if name in ctx.headers}
        )
        if opening is None:  # hashing the opening costs as much as the first user message is long
            opening = fingerprint(dialect.opening(payload, opening_messages), tenant)
        session_id = ctx.explicit_session or opening
        factor = self.calibration.factor(model)
        return ParsedRequest(
            dialect=dialect,
            body=body,
            payload=payload,
            messages=messages,
            extras=dialect.extras(payload),
            model=model,
            window=self.learned.window(model, self._settings.models.context_window_for(model)),
            max_output_tokens=dialect.max_output(payload),
            session_id=session_id,
            opening=opening,
            # The client's own: the summarizer adds the key of the upstream it calls.
            credential=ctx.headers.get("Authorization"),
            auth_headers=auth,
            tenant=tenant,
            seed=conversation_seed(tenant.hex(), session_id),
            factor=factor,
            estimator=HeuristicEstimator(factor, shape=dialect.shape),
        )

    async def _prepare(self, body: bytes, request: ParsedRequest, known: Known | None) -> Exchange:
        if known is not None:  # counted off the loop already
            tokens = estimate_known(request, known)
        else:
            tokens = self._conversations.estimate(request, request.messages)
        if self._conversations.needs(request, tokens):
            digests = known.request_digests() if known is not None else None
            decision = await self._conversations.compact(request, tokens, digests)
        else:
            decision = Decision(request.messages, "none", tokens, tokens, None)
        self._metrics.decisions.labels(status=decision.status, dialect=request.dialect.name).inc()
        self._precompute.after_forwarding(request, decision.tokens_after, tokens)
        return self._exchange(body, request, decision, known)

    def _exchange(
        self, body: bytes, request: ParsedRequest, decision: Decision, known: Known | None = None
    ) -> CompactedExchange:
        if decision.messages is request.messages:
            forwarded = body
        elif known is not None:
            forwarded = known.splice(view_parts(request.messages, decision.messages))
        else:
            # Chat's kept messages go out as the client's bytes on both paths (see splice_view).
            spliced = None
            if request.dialect.name == "chat":
                spliced = splice_view(body, b'"messages"', request.messages, decision.messages)
            forwarded = spliced or request.serialize(decision.messages)
        return CompactedExchange(
            request,
            body=forwarded,
            tokens=decision.tokens_after,
            headers=describe(request, decision),
            conversations=self._conversations,
            calibration=self.calibration,
            learned=self.learned,
            metrics=self._metrics,
        )


def build_hook(
    settings: Settings,
    *,
    upstream: Upstream,
    store: CheckpointStore,
    llm_for: LLMFactory | None,
    records: SessionRecords,
    metrics: CompactionMetrics,
    tasks: BackgroundTasks,
    compactor: Compactor | None = None,
    state: StateBackend | None = None,
    offload: Offload | None = None,
) -> CompactingHook:
    """The compacting hook, configured from `settings` (see app.create_app). `llm_for` defaults
    to summarizers over `upstream`, `compactor` to the library's, configured from `settings`
    with `offload` running compactions' CPU work (default: inline), `state` (cooldowns,
    single-flight leases) to the process's own."""
    options = settings.compaction
    state = state or MemoryStore(
        options.checkpoint_max_entries,
        options.checkpoint_ttl_s,
        failure_threshold=options.failure_threshold,
        failure_cooldown_s=options.failure_cooldown_s,
    )
    # A request stops waiting after summary_timeout_s; the summarization itself may go on a
    # while longer in the background and still record its checkpoint.
    llm_timeout_s = options.summary_timeout_s * _BACKGROUND_TIMEOUT_FACTOR
    compactor = compactor or Compactor(
        settings=options.library_settings(llm_timeout_s=llm_timeout_s),
        memory=MemoryWriter(settings.memory.dir, claims=state),
        offload=offload,
    )
    conversations = Conversations(
        options,
        compactor=compactor,
        store=store,
        state=state,
        llm_for=llm_for or UpstreamLLMFactory(upstream, timeout_s=llm_timeout_s),
        records=records,
        metrics=metrics,
        tasks=tasks,
    )
    return CompactingHook(
        settings,
        conversations=conversations,
        precompute=Precompute(options, conversations, tasks),
        metrics=metrics,
        known=KnownRequests(
            max_bytes=int(options.known_requests_mb * 1024 * 1024),
            min_body_bytes=_KNOWN_MIN_BODY_BYTES,
            offload=offload,
        ),
    )
