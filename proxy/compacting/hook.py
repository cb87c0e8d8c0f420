"""The compacting hook: the proxy's per-request compaction decision (proxy.hook.Hook).

Bodies that cannot reach the lowest ratio are not parsed; below the trigger the original bytes go
upstream untouched. At the trigger the conversations (proxy.compacting.conversations) give the
view to forward: a remembered checkpoint, or a new compaction. Each hooked route has its dialect
(proxy.compacting.dialects); a parsed request becomes a CompactedExchange (proxy.compacting.exchange), which owns the retry and the calibration.
Anything that fails here forwards the original request; it never fails the agent's request.
"""

from __future__ import annotations

import logging

from compaction import Compactor, HeuristicEstimator, MemoryWriter
from compaction.checkpoints import CheckpointStore, conversation_seed
from proxy.compacting.calibration import Calibration
from proxy.compacting.conversations import Conversations, Decision
from proxy.compacting.dialects import Dialect, NotCompactable, for_route
from proxy.compacting.exchange import CompactedExchange
from proxy.compacting.llm_client import LLMFactory, UpstreamLLMFactory
from proxy.compacting.precompute import Precompute
from proxy.compacting.request import ParsedRequest, fingerprint, may_need_parsing, model_of
from proxy.hook import Exchange, Passthrough, RequestContext
from proxy.http.sessions import SessionRecords
from proxy.http.upstream import Upstream
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
# How much longer than a waiting request the summarizer call itself may take.
_BACKGROUND_TIMEOUT_FACTOR = 3


class CompactingHook:
    def __init__(
        self,
        settings: Settings,
        *,
        conversations: Conversations,
        precompute: Precompute,
        metrics: CompactionMetrics,
    ) -> None:
        self._settings = settings
        self._options = settings.compaction
        self._conversations = conversations
        self._precompute = precompute
        self._metrics = metrics
        self.calibration = Calibration()
        models = settings.models
        self._smallest_window = min(
            [models.default_context_window, *models.context_windows.values()]
        )

    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        untouched = Passthrough(
            body=body, headers={STATUS: "none"}, session_id=ctx.explicit_session
        )
        dialect = for_route(ctx.route)
        if dialect is None or not self._options.enabled or not self._may_reach(body):
            return untouched
        try:
            request = self._parse(ctx, dialect, body)
        except NotCompactable:
            return untouched
        try:
            return await self._prepare(body, request)
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
        return may_need_parsing(
            body, smallest_window=self._smallest_window, lowest_ratio=ratio, factor=factor
        )

    def _parse(self, ctx: RequestContext, dialect: Dialect, body: bytes) -> ParsedRequest:
        payload, messages = dialect.parse(body)
        model = model_of(payload)
        auth = {name: ctx.headers[name] for name in _AUTH_HEADERS if name in ctx.headers}
        tenant = conversation_seed(ctx.credential or "", *auth.values())
        # Headers the summary call needs but that do not name the caller (anthropic-version).
        auth.update(
            {name: ctx.headers[name] for name in dialect.call_headers if name in ctx.headers}
        )
        opening = fingerprint(dialect.opening(payload, messages))
        session_id = ctx.explicit_session or opening
        factor = self.calibration.factor(model)
        return ParsedRequest(
            dialect=dialect,
            body=body,
            payload=payload,
            messages=messages,
            extras=dialect.extras(payload),
            model=model,
            window=self._settings.models.context_window_for(model),
            max_output_tokens=dialect.max_output(payload),
            session_id=session_id,
            opening=opening,
            credential=ctx.credential,
            auth_headers=auth,
            tenant=tenant,
            seed=conversation_seed(tenant.hex(), session_id),
            factor=factor,
            estimator=HeuristicEstimator(factor, shape=dialect.shape),
        )

    async def _prepare(self, body: bytes, request: ParsedRequest) -> Exchange:
        tokens = self._conversations.estimate(request, request.messages)
        if self._conversations.needs(request, tokens):
            decision = await self._conversations.compact(request, tokens)
        else:
            decision = Decision(request.messages, "none", tokens, tokens, None)
        self._metrics.decisions.labels(status=decision.status, dialect=request.dialect.name).inc()
        self._precompute.after_forwarding(request, decision.tokens_after, tokens)
        headers = {
            STATUS: decision.status,
            SESSION: request.session_id,
            TOKENS_BEFORE: str(decision.tokens_before),
            TOKENS_AFTER: str(decision.tokens_after),
        }
        if decision.compaction_id:
            headers[COMPACTION_ID] = decision.compaction_id
        forwarded = (
            request.serialize(decision.messages)
            if decision.messages is not request.messages
            else body
        )
        return CompactedExchange(
            request,
            body=forwarded,
            tokens=decision.tokens_after,
            headers=headers,
            conversations=self._conversations,
            calibration=self.calibration,
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
) -> CompactingHook:
    """The compacting hook, configured from `settings` (see app.create_app). `llm_for` defaults
    to summarizers over `upstream`."""
    options = settings.compaction
    # A request stops waiting after summary_timeout_s; the summarization itself may go on a
    # while longer in the background and still record its checkpoint.
    llm_timeout_s = options.summary_timeout_s * _BACKGROUND_TIMEOUT_FACTOR
    compactor = Compactor(
        settings=options.library_settings(llm_timeout_s=llm_timeout_s),
        memory=MemoryWriter(settings.memory.dir),
    )
    conversations = Conversations(
        options,
        compactor=compactor,
        store=store,
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
    )
