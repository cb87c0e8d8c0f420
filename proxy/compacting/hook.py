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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from compaction import Compactor, HeuristicEstimator, MemoryWriter
from compaction.checkpoints import CheckpointStore, conversation_seed
from proxy.compacting.calibration import Calibration
from proxy.compacting.conversations import Conversations, Decision
from proxy.compacting.dialects import Dialect, NotCompactable, for_route
from proxy.compacting.exchange import SESSION, STATUS, CompactedExchange, describe
from proxy.compacting.llm_client import LLMFactory, UpstreamLLMFactory
from proxy.compacting.overflow import LearnedWindows, parse_overflow
from proxy.compacting.precompute import Precompute
from proxy.compacting.request import ParsedRequest, fingerprint, may_need_parsing, model_of
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
        self.learned = LearnedWindows()
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
            return _Unparsed(
                untouched,
                lambda status, error: self._retry_unparsed(ctx, dialect, body, status, error),
            )
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
        model = model_of(payload)
        auth = {name: ctx.headers[name] for name in _AUTH_HEADERS if name in ctx.headers}
        tenant = conversation_seed(ctx.credential or "", *auth.values())
        # Headers the summary call needs but that do not name the caller (anthropic-version).
        auth.update(
            {name: ctx.headers[name] for name in dialect.call_headers if name in ctx.headers}
        )
        opening = fingerprint(dialect.opening(payload, messages), tenant)
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
        return self._exchange(body, request, decision)

    def _exchange(
        self, body: bytes, request: ParsedRequest, decision: Decision
    ) -> CompactedExchange:
        forwarded = (
            request.serialize(decision.messages)
            if decision.messages is not request.messages
            else body
        )
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


class _Unparsed:
    """The exchange of a request forwarded unparsed: passes through, unless the upstream
    answers a context-length error; then `retry` parses and compacts it, and the exchange that
    made the retry speaks for the request from then on (headers, calibration)."""

    def __init__(
        self,
        untouched: Passthrough,
        retry: Callable[[int, bytes], Awaitable[CompactedExchange | None]],
    ) -> None:
        self._current: Exchange = untouched
        self._retry = retry

    @property
    def body(self) -> bytes:
        return self._current.body

    @property
    def headers(self) -> Mapping[str, str]:
        return self._current.headers

    @property
    def session_id(self) -> str | None:
        return self._current.session_id

    @property
    def wants_usage(self) -> bool:
        return self._current.wants_usage

    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        if not isinstance(self._current, Passthrough):
            return None  # one retry only
        retried = await self._retry(status, body)
        if retried is None:
            return None
        self._current = retried
        return retried.body

    def observe(self, status: int, usage: dict[str, Any] | None) -> None:
        self._current.observe(status, usage)


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
) -> CompactingHook:
    """The compacting hook, configured from `settings` (see app.create_app). `llm_for` defaults
    to summarizers over `upstream`, `compactor` to the library's, configured from `settings`,
    `state` (cooldowns, single-flight leases) to the process's own."""
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
    )
