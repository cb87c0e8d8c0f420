"""The compacting hook: the proxy's per-request compaction decision (proxy.interception.Hook).

Bodies that cannot reach the lowest ratio are not parsed; below the trigger the original bytes go
upstream untouched. At the trigger the conversations (proxy.compacting.conversations) give the
view to forward: a remembered checkpoint, or a new compaction. Each hooked route has its dialect
(proxy.compacting.dialects); a long conversation's next request is recognized from its last one
and mostly decided from what is remembered (proxy.compacting.recall); a parsed request becomes a
CompactedExchange (proxy.compacting.exchange), which owns the retry and the calibration.
Anything that fails here forwards the original request; it never fails the agent's request.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from compaction import CheckpointStore, Compactor, MemoryWriter, Offload
from proxy.compacting.archiving import Archiving
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
from proxy.compacting.known import Known, KnownRequests
from proxy.compacting.llm_client import LLMFactory, UpstreamLLMFactory
from proxy.compacting.overflow import LearnedWindows, parse_overflow
from proxy.compacting.parts import splice_view, view_parts
from proxy.compacting.precompute import Precompute
from proxy.compacting.recall import Recall, estimate_known
from proxy.compacting.request import Decision, ParsedRequest, RequestBuilder, may_need_parsing
from proxy.compacting.stores.backend import StateBackend
from proxy.compacting.stores.memory import MemoryStore
from proxy.http.sessions import SessionRecords
from proxy.http.upstream import Upstream
from proxy.interception import Exchange, Passthrough, RequestContext
from proxy.metrics import CompactionMetrics
from proxy.settings import Settings
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

# The headers of a request left as it came (one mapping shared by all: it is only read).
_UNCHANGED: Mapping[str, str] = MappingProxyType({STATUS: "none"})

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
        self._builder = RequestBuilder(settings.models, self.calibration, self.learned)
        self._recall = Recall(
            known or KnownRequests(max_bytes=0, min_body_bytes=0),
            builder=self._builder,
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
        self._lowest_ratio = min(self._options.precompute_ratio or 1.0, self._options.trigger_ratio)

    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        untouched = Passthrough(body=body, headers=_UNCHANGED, session_id=ctx.explicit_session)
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
        key = self._recall.key(ctx, dialect, body)  # long conversations are remembered
        known = None
        if key is not None:
            try:
                recalled, known = await self._recall.recall(key, ctx, dialect, body)
            except Exception:  # only this request's speed depends on it: the full path decides
                log.exception("recognizing a known request failed; taking the full path")
                recalled, known = None, None
            if recalled is not None:
                return recalled
        try:
            request = await self._builder.parse(ctx, dialect, body)
        except NotCompactable:
            return untouched
        if key is not None and known is None:
            known = await self._recall.learn(key, body, request)
        if known is not None:
            request = request.located(known.array(), known.count)
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
        learned = self.learned.smallest()
        smallest = self._smallest_window if learned is None else min(learned, self._smallest_window)
        return may_need_parsing(
            body,
            smallest_window=smallest,
            lowest_ratio=self._lowest_ratio,
            factor=self.calibration.max_factor,
        )

    async def _retry_unparsed(
        self, ctx: RequestContext, dialect: Dialect, body: bytes, status: int, error: bytes
    ) -> CompactedExchange | None:
        """An exchange that retried the unparsed request `body` after the upstream's
        context-length `error`, or None (not an overflow, nothing to compact, nothing to retry
        with)."""
        if parse_overflow(status, error) is None:
            return None
        try:
            request = await self._builder.parse(ctx, dialect, body)
        except NotCompactable:
            return None
        tokens = self._conversations.estimate(request, request.messages)
        unchanged = Decision(request.messages, "none", tokens, tokens, None)
        exchange = self._exchange(body, request, unchanged)
        return exchange if await exchange.retry_after_error(status, error) else None

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
        self._metrics.decided(decision.status, request.dialect.name).inc()
        self._precompute.after_forwarding(request, decision.tokens_after, tokens)
        return self._exchange(body, request, decision, known)

    def _exchange(
        self, body: bytes, request: ParsedRequest, decision: Decision, known: Known | None = None
    ) -> CompactedExchange:
        dialect = request.dialect
        if decision.messages is request.messages:
            forwarded = body
        elif known is not None:
            forwarded = known.splice(view_parts(request.messages, dialect.wire(decision.messages)))
        else:
            # Kept items go out as the client's bytes whether or not the body is remembered.
            wire = dialect.wire(decision.messages)
            spliced = splice_view(body, dialect.items_key, request.messages, wire)
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
    known: KnownRequests | None = None,
    archiving: Archiving | None = None,
) -> CompactingHook:
    """The compacting hook, configured from `settings` (see app.create_app). `llm_for` defaults
    to summarizers over `upstream`, `compactor` to the library's, configured from `settings`
    with `offload` running compactions' CPU work (default: inline), `state` (cooldowns,
    single-flight leases) to the process's own, `known` (long requests remembered) to one of
    `compaction.known_requests_mb`; `archiving` (folded turns archived) to none."""
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
        archiving=archiving,
    )
    return CompactingHook(
        settings,
        conversations=conversations,
        precompute=Precompute(options, conversations, tasks),
        metrics=metrics,
        known=known
        or KnownRequests(
            max_bytes=int(options.known_requests_mb * 1024 * 1024),
            min_body_bytes=_KNOWN_MIN_BODY_BYTES,
            offload=offload,
        ),
    )
