"""The compacting hook: the proxy's per-request compaction decision (proxy.interception.Hook).

Bodies that cannot reach the lowest ratio are not parsed; below the trigger the original bytes go
upstream untouched. At the trigger the conversations (proxy.compacting.decision.conversations)
give the view to forward: a remembered checkpoint, or a new compaction; one decision
(Conversations.decide) reads the request's history. Each hooked route has its dialect
(proxy.dialects). The speed machinery sits behind one door (proxy.compacting.fast):
a long conversation's next request is recognized from its last one and mostly answered from
what is remembered, a large body is parsed in pieces, forwarded lists are spliced from the
client's bytes. A parsed request becomes a CompactedExchange
(proxy.compacting.decision.exchange), which owns the retry and the calibration. Anything that fails here forwards the original request; it
never fails the agent's request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from compaction import CheckpointStore, Compactor, MemoryWriter, MentionCache, Offload
from proxy.admin.records import SessionRecords
from proxy.compacting.background.archiving import Archiving
from proxy.compacting.background.dumps import Dump, RequestDumps
from proxy.compacting.decision.conversations import Conversations, Deadline
from proxy.compacting.decision.exchange import (
    CompactedExchange,
    ExchangeFactory,
    ShadowExchange,
    UnparsedExchange,
)
from proxy.compacting.decision.history import History, ListHistory
from proxy.compacting.decision.precompute import Precompute
from proxy.compacting.decision.request import (
    Decision,
    ParsedRequest,
    RequestBuilder,
    may_need_parsing,
)
from proxy.compacting.decision.thinking import BoundThinking
from proxy.compacting.fast import BodyIndex, BodyIndexes, FastPath, parse_in_pieces
from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.discovery import WindowDiscovery
from proxy.compacting.models.llm_client import LLMFactory, NativeCompactor, UpstreamLLMFactory
from proxy.compacting.models.overflow import LearnedWindows, parse_overflow
from proxy.dialects import Dialect, NotCompactable, for_route
from proxy.http.upstream import Upstream
from proxy.interception import Exchange, Passthrough, RequestContext
from proxy.metrics import CompactionMetrics
from proxy.outcome import UNCHANGED, Outcome, add_headers
from proxy.recall import Recall
from proxy.settings import Settings
from proxy.state.factory import build_local
from proxy.state.roles import StateBackend
from proxy.tasks import BackgroundTasks

log = logging.getLogger(__name__)

# How much longer than a waiting request the summarizer call itself may take.
_BACKGROUND_TIMEOUT_FACTOR = 3
# Below this a body is parsed whole in well under a millisecond: not worth remembering.
_INDEXED_MIN_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Shared:
    """What the compacting hook shares with the rest of the app (built in app.create_app): the
    upstream its summarizers call, the /admin records, the metrics, the background tasks, the
    processes CPU work runs in, and what the upstream taught about token counts and windows."""

    upstream: Upstream
    records: SessionRecords
    metrics: CompactionMetrics
    tasks: BackgroundTasks
    calibration: Calibration
    learned: LearnedWindows
    offload: Offload | None = None
    archiving: Archiving | None = None
    """Archives each compaction's folded turns (proxy.compacting.background.archiving); None:
    not kept."""
    recall: Recall | None = None
    """Offers compacted requests the `recall` tool (proxy.recall); None: `compaction.recall`
    off."""


@dataclass(frozen=True)
class Replacements:
    """Parts of the hook a caller may replace (None: built from the settings): the checkpoint
    `store`, the `state` (cooldowns, single-flight leases; default the process's own), the
    summarizer for a request (`llm_for`; default over the upstream), the `compactor` (default
    the library's), the long bodies' `indexes` (default: `compaction.known_requests_mb` of
    them)."""

    store: CheckpointStore | None = None
    state: StateBackend | None = None
    llm_for: LLMFactory | None = None
    compactor: Compactor | None = None
    indexes: BodyIndexes | None = None


class CompactingHook:
    def __init__(
        self,
        settings: Settings,
        *,
        conversations: Conversations,
        precompute: Precompute,
        shared: Shared,
        indexes: BodyIndexes,
        discovery: WindowDiscovery | None = None,
        dumps: RequestDumps | None = None,
    ) -> None:
        self._settings = settings
        self._dumps = dumps
        self._discovery = discovery
        self._options = settings.compaction
        self._conversations = conversations
        self._precompute = precompute
        self._metrics = shared.metrics
        self._recall = shared.recall
        self._calibration = shared.calibration
        self._learned = shared.learned
        self._builder = RequestBuilder(
            settings.models,
            shared.calibration,
            shared.learned,
            parse=parse_in_pieces,
            discovery=discovery,
        )
        self._exchanges = ExchangeFactory(
            conversations=conversations,
            calibration=shared.calibration,
            learned=shared.learned,
            metrics=shared.metrics,
        )
        self._fast = FastPath(
            indexes,
            builder=self._builder,
            conversations=conversations,
            precompute=precompute,
            metrics=shared.metrics,
            exchanges=self._exchanges,
        )
        models = settings.models
        self._smallest_window = min(
            [models.default_context_window, *models.context_windows.values()]
        )
        self._lowest_ratio = min(self._options.precompute_ratio or 1.0, self._options.trigger_ratio)
        self._trigger = self._options.trigger

    async def prepare(self, ctx: RequestContext, body: bytes) -> Exchange:
        untouched = Passthrough(body=body, outcome=UNCHANGED, session_id=ctx.explicit_session)
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
        # Every wait of this request, in the pool and on a summarizer, counts from now.
        deadline = self._conversations.deadline()
        key = self._fast.key(ctx, dialect, body)  # long conversations are remembered
        index = None
        if key is not None:
            try:
                answered, index = await self._fast.answer(key, ctx, dialect, body)
            except Exception:  # only this request's speed depends on it: the full path decides
                log.exception("recognizing a known request failed; taking the full path")
                answered, index = None, None
            if answered is not None:
                return self._shown(answered, ctx, dialect, body)
        try:
            request = await self._builder.parse(ctx, dialect, body)
        except NotCompactable:
            return untouched
        if key is not None and index is None:
            index = await self._fast.remember(key, body, request, deadline)
        if index is not None:
            request = request.located(index.array(), index.count)
        try:
            return self._shown(await self._prepare(request, index, deadline), ctx, dialect, body)
        except Exception:  # fail open: the agent's request always goes through
            log.exception("compaction failed; forwarding the original request")
            self._metrics.errors.inc()
            return Passthrough(
                body=body,
                outcome=Outcome("failed", request.session_id),
                session_id=request.session_id,
            )

    def _shown(
        self, exchange: CompactedExchange, ctx: RequestContext, dialect: Dialect, body: bytes
    ) -> Exchange:
        """The exchange a decision goes out as, counted under the status the client is told:
        in shadow mode a compaction (applied or reused) is computed and recorded as in `on`,
        and the client's own `body` goes upstream instead. A compacted request is dumped
        (logging.dump_dir) as received and as compacted."""
        status = exchange.outcome.status
        shown: Exchange = exchange
        if status == "skipped":
            # Its client or provider compacts it: as sent, with nothing added (no recall tool)
            # and nothing retried compacted after an error.
            shown = Passthrough(
                body=exchange.body, session_id=exchange.session_id, outcome=exchange.outcome
            )
        elif status in ("applied", "reused"):
            if self._options.mode == "shadow":
                shown, status = ShadowExchange(exchange, body), "shadow"
            elif self._recall is not None:
                exchange.offer_recall(self._recall)
            if self._dumps is not None:
                meta = {"route": ctx.route, "path": ctx.path}
                add_headers(meta, shown.outcome)  # a dump tells what the client was told
                self._dumps.dump(Dump(exchange.session_id, body, exchange.body, meta, ctx.headers))
        self._metrics.decided(status, dialect.name).inc()
        return shown

    # -- deciding ----------------------------------------------------------------------------

    def _may_reach(self, body: bytes) -> bool:
        discovered = self._discovery.smallest() if self._discovery is not None else None
        known = [w for w in (self._learned.smallest(), discovered) if w is not None]
        smallest = min([self._smallest_window, *known])
        return may_need_parsing(
            body,
            smallest_window=smallest,
            # The ratios are shares of the trigger's effective window (compaction.Trigger).
            lowest_tokens=self._lowest_ratio * self._trigger.effective_window(smallest),
            factor=self._calibration.max_factor,
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
        history = ListHistory.of(request)
        if self._conversations.steps_aside(request, history) is not None:
            return None  # its client or provider compacts it: the error is theirs to handle
        tokens = self._conversations.estimate(request, history)
        unchanged = Decision(request.messages, "none", tokens, tokens, None)
        exchange = self._exchange(request, unchanged)
        return exchange if await exchange.retry_after_error(status, error) else None

    async def _prepare(
        self, request: ParsedRequest, index: BodyIndex | None, deadline: Deadline
    ) -> CompactedExchange:
        # A remembered body's index is its history counted and hashed off the loop already.
        history: History = index if index is not None else ListHistory.of(request)
        choice = await self._conversations.decide(request, history)
        decision = await self._conversations.carry_out(request, history, choice, deadline)
        if choice.stepped_aside is None:  # its conversation goes on without what it compacts
            self._precompute.after_forwarding(request, decision.tokens_after, choice.before)
        return self._exchange(request, decision, index)

    def _exchange(
        self, request: ParsedRequest, decision: Decision, index: BodyIndex | None = None
    ) -> CompactedExchange:
        decision = self._conversations.thinking.forwarded(request, decision)
        messages = decision.messages
        if messages is request.messages:
            forwarded = request.body
        else:
            spliced = self._fast.forwarded_body(request, messages, index)
            forwarded = spliced or request.serialize(messages)
        return self._exchanges.build(request, decision, forwarded)


def build_hook(
    settings: Settings, shared: Shared, replacements: Replacements | None = None
) -> CompactingHook:
    """The compacting hook, configured from `settings` (see app.create_app), over the parts it
    shares with the app and the `replacements` a caller gives; `shared.offload` runs
    compactions' and indexes' CPU work (default: inline)."""
    options = settings.compaction
    given = replacements or Replacements()
    state = given.state or build_local(options)
    # A request stops waiting after summary_timeout_s; the summarization itself may go on a
    # while longer in the background and still record its checkpoint.
    llm_timeout_s = options.summary_timeout_s * _BACKGROUND_TIMEOUT_FACTOR
    compactor = given.compactor or Compactor(
        settings=options.library_settings(llm_timeout_s=llm_timeout_s),
        memory=MemoryWriter(
            settings.memory.dir,
            claims=state,
            max_sessions=settings.memory.max_sessions,
            max_items=settings.memory.cached_items,
        ),
        offload=shared.offload,
        mentions=MentionCache(options.scanned_chars),
    )
    conversations = Conversations(
        options,
        compactor=compactor,
        store=given.store or state,
        leases=state,
        cooldowns=state,
        marks=state,
        llm_for=given.llm_for
        or UpstreamLLMFactory(
            shared.upstream, timeout_s=llm_timeout_s, max_models=settings.models.max_models
        ),
        records=shared.records,
        metrics=shared.metrics,
        tasks=shared.tasks,
        archiving=shared.archiving,
        recall=shared.recall,
        thinking=BoundThinking(settings.models, options.checkpoint_max_entries, bound=state),
        native=NativeCompactor(shared.upstream, timeout_s=llm_timeout_s)
        if options.summarizer == "native"
        else None,
    )
    discovery = None
    if settings.models.discover:
        discovery = WindowDiscovery(
            lambda: shared.upstream.session,
            settings.upstream.base_url,
            timeout_s=settings.upstream.connect_timeout_s,
            wait_s=settings.models.discover_timeout_s,
            spawn=lambda lookup, name: shared.tasks.spawn(lookup, name=name),
            max_models=settings.models.max_models,
        )
    dumps = None
    if settings.logging.dump_dir is not None:
        dumps = RequestDumps(
            settings.logging.dump_dir,
            max_files=settings.logging.dump_max_files,
            max_bytes=int(settings.logging.dump_max_mb * 1024 * 1024),
            tasks=shared.tasks,
        )
    return CompactingHook(
        settings,
        discovery=discovery,
        dumps=dumps,
        conversations=conversations,
        precompute=Precompute(options, conversations, shared.tasks),
        shared=shared,
        indexes=given.indexes
        or BodyIndexes(
            max_bytes=int(options.known_requests_mb * 1024 * 1024),
            max_conversations=options.known_requests,
            min_body_bytes=_INDEXED_MIN_BODY_BYTES,
            offload=shared.offload,
        ),
    )
