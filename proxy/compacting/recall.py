"""The decision for a request recognized as the continuation of a known one (proxy.compacting.
known), made from what is remembered: no full parse, no re-hashing, no re-counting.

It settles what most requests of a long conversation are: below the trigger with nothing to do
(`none`), and a remembered checkpoint whose view fits (`reused`, or `applied` the first time it
goes out), a reserve checkpoint included once the view it extends reaches the trigger (its memory
items are written then, once, as the full path writes them). Everything else (a compaction to
run, a precompute to start, an estimate too close to the trigger to trust the per-item
rounding) is left to the full path: `decide` returns None. Any dialect: the forwarded list is
spliced from the client's bytes as the full path splices it (Anthropic's joined summary turn
included).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import orjson

from compaction import REPLY_PRIMING_TOKENS, Checkpoint, HeuristicEstimator
from proxy.compacting.calibration import Calibration
from proxy.compacting.conversations import Conversations
from proxy.compacting.dialects import Dialect, NotCompactable
from proxy.compacting.exchange import CompactedExchange, describe
from proxy.compacting.known import Known, KnownRequests
from proxy.compacting.overflow import LearnedWindows
from proxy.compacting.parts import Part, view_parts
from proxy.compacting.precompute import Precompute
from proxy.compacting.request import (
    SCOPE_HEADERS,
    Decision,
    ParsedRequest,
    RequestBuilder,
    opening_of,
)
from proxy.compacting.workers import WorkerLost
from proxy.interception import RequestContext
from proxy.metrics import CompactionMetrics

log = logging.getLogger(__name__)

# The remembered counts are per item at calibration 1 and scaled as a sum, the full path rounds
# per item: within this margin of the trigger the full path decides.
_TRIGGER_MARGIN = 1.01
# Anthropic's wire joins the summary with the user turns after it; turns alternate, so there are
# a few. More than this (a client that does not alternate) is left to the full path.
_MAX_JOINED = 16


@dataclass(frozen=True)
class Recalled:
    status: str
    tokens_before: int
    tokens_after: int
    checkpoint: Checkpoint | None
    body: bytes


class Recall:
    """The compacting hook's path for a long conversation's next request: recognized from the
    last one (proxy.compacting.known), decided from what is remembered when it can be."""

    def __init__(
        self,
        known: KnownRequests,
        *,
        builder: RequestBuilder,
        conversations: Conversations,
        precompute: Precompute,
        metrics: CompactionMetrics,
        calibration: Calibration,
        learned: LearnedWindows,
    ) -> None:
        self._known = known
        self._builder = builder
        self._conversations = conversations
        self._precompute = precompute
        self._metrics = metrics
        self._calibration = calibration
        self._learned = learned

    def key(self, ctx: RequestContext, dialect: Dialect, body: bytes) -> int | None:
        """The conversation `body` belongs to: its API, the caller's credentials and named
        session (None: too small to remember)."""
        auth = [ctx.headers.get(name, "") for name in SCOPE_HEADERS]
        scope = [dialect.name, ctx.credential or "", ctx.explicit_session or "", *auth]
        return self._known.conversation_key("\x00".join(scope), body)

    async def recall(
        self, key: int, ctx: RequestContext, dialect: Dialect, body: bytes
    ) -> tuple[CompactedExchange | None, Known | None]:
        """The exchange decided from what is known (None: the full path decides) and what is
        known of `body` (None: not recognized)."""
        seen = self._known.recognize(key, body, dialect.items_key)
        if seen is None:
            return None, None
        try:
            dialect.items(seen.fields)  # e.g. a `previous_response_id` after the list
        except NotCompactable:
            return None, None
        remembered, opening = seen.known.fingerprint or (None, None)
        opening_items = seen.known.opening
        if len(opening_items) == seen.known.count and seen.added:
            # No user message among the known items (or only as the last): the first one, which
            # the fingerprint reads, may be among the added ones.
            opening_items = opening_of([*opening_items, *seen.added])
        now = dialect.opening(seen.fields, opening_items)
        unchanged = now == remembered
        request = self._builder.build(
            ctx, dialect, body, seen.fields, [], opening_items, opening if unchanged else None
        )
        if request.seed != seen.known.seed:
            return None, None
        fingerprint = None if unchanged else (now, request.opening)
        known = self._known.extend(key, seen, fingerprint, opening_items)
        try:
            recalled = await decide(request, known, self._conversations, self._precompute)
        except Exception:  # the full path decides instead
            log.exception("deciding from a known request failed; taking the full path")
            recalled = None
        self._metrics.recognized_by("full" if recalled is None else "known", dialect.name).inc()
        if recalled is None:
            return None, known
        self._metrics.decided(recalled.status, dialect.name).inc()
        compaction_id = recalled.checkpoint.compaction_id if recalled.checkpoint else None
        decision = Decision(
            [], recalled.status, recalled.tokens_before, recalled.tokens_after, compaction_id
        )
        exchange = CompactedExchange(
            request,
            body=recalled.body,
            tokens=recalled.tokens_after,
            headers=describe(request, decision),
            conversations=self._conversations,
            calibration=self._calibration,
            learned=self._learned,
            metrics=self._metrics,
            full=lambda: self._builder.parse(ctx, dialect, body),
        )
        return exchange, known

    async def learn(self, key: int, body: bytes, request: ParsedRequest) -> Known | None:
        """Remember a parsed request (the next of its conversation is then recognized)."""
        dialect = request.dialect
        opening = opening_of(request.messages)
        try:
            return await self._known.learn(
                key,
                body,
                len(request.messages),
                items_key=dialect.items_key,
                shape=dialect.shape,
                seed=request.seed,
                opening=opening,
                fingerprint=(dialect.opening(request.payload, opening), request.opening),
            )
        except WorkerLost:  # logged where it was found
            return None
        except Exception:  # only the next request's speed depends on it
            log.exception("remembering a long request failed")
            return None


async def decide(
    request: ParsedRequest, known: Known, conversations: Conversations, precompute: Precompute
) -> Recalled | None:
    """What the full path (CompactingHook._prepare, Conversations.compact and view) would
    decide for `request`, or None when that takes more than what is remembered."""
    before = estimate_known(request, known)
    over = _over(conversations, request, before)
    if over is None:
        return None
    if not over:
        if precompute.would_start(request, before, before):
            return None
        return Recalled("none", before, before, None, known.body)
    checkpoint = await conversations.latest(known.digests, known.count)
    if checkpoint is not None and checkpoint.precomputed:
        # Held in reserve until the view it extends reaches the trigger (Conversations.view);
        # from then on it is the view, and its memory items are due (written once).
        parent = await conversations.stored(known.request_digests(), checkpoint.parent)
        parent_over = _over(conversations, request, _view_estimate(request, known, parent))
        if parent_over is None:
            return None
        if parent_over:
            await conversations.flush_reserve(request, checkpoint)
        else:
            checkpoint = parent
            if parent is not None and parent.precomputed:  # an earlier write may have failed
                await conversations.flush_reserve(request, parent)
    if checkpoint is None or checkpoint.cut > known.count:
        return None  # a compaction to run
    after = _view_estimate(request, known, checkpoint)
    if _over(conversations, request, after) is not False:
        return None  # still over: a compaction to run (or too close to tell)
    if precompute.would_start(request, after, before):
        return None
    parts = _wire_parts(known, checkpoint, request.dialect)
    if parts is None:
        return None
    status = await conversations.substituted(checkpoint.compaction_id)
    return Recalled(status, before, after, checkpoint, known.splice(parts))


def _over(conversations: Conversations, request: ParsedRequest, tokens: int) -> bool | None:
    """Whether `tokens` needs a compaction, None when too close to the trigger to tell from
    counts rounded unlike the full path's."""
    if conversations.needs(request, int(tokens / _TRIGGER_MARGIN) - 1):
        return True
    if not conversations.needs(request, int(tokens * _TRIGGER_MARGIN) + 1):
        return False
    return None


def estimate_known(request: ParsedRequest, known: Known) -> int:
    """The request's estimate from the remembered counts (the full path's, up to rounding)."""
    fixed = request.estimator.count_tools(request.extras) + REPLY_PRIMING_TOKENS
    return round(known.tokens[known.count] * request.factor) + fixed


def _view_estimate(request: ParsedRequest, known: Known, checkpoint: Checkpoint | None) -> int:
    """The estimate of the view `checkpoint` gives (None: the original request)."""
    if checkpoint is None:
        return estimate_known(request, known)
    tokens = known.tokens
    pinned = sum(tokens[i + 1] - tokens[i] for i in checkpoint.pinned)
    summary = HeuristicEstimator(shape=request.dialect.shape).count_message(
        checkpoint.summary_message
    )
    kept = tokens[known.count] - tokens[checkpoint.cut]
    raw = tokens[checkpoint.head_end] + summary + pinned + kept
    fixed = request.estimator.count_tools(request.extras) + REPLY_PRIMING_TOKENS
    return round(raw * request.factor) + fixed


def _wire_parts(known: Known, checkpoint: Checkpoint, dialect: Dialect) -> list[Part] | None:
    """Checkpoint.apply then Dialect.wire, as splice parts: the bytes the full path splices."""
    summary = checkpoint.summary_message
    if not dialect.joins_summary:
        return [
            range(checkpoint.head_end),
            orjson.dumps(summary),
            *checkpoint.pinned,
            range(checkpoint.cut, known.count),
        ]
    # The wire joins the summary with the user turns right after it: only those are read. A head
    # before the summary would have to be read too (Anthropic's head is its top-level `system`).
    if checkpoint.head_end:
        return None
    taken = list(checkpoint.pinned)
    turns = [known.item(i) for i in taken]
    end = checkpoint.cut
    while end < known.count:
        if len(taken) >= _MAX_JOINED:
            return None
        turn = known.item(end)
        if not (isinstance(turn, dict) and turn.get("role") == "user"):
            break
        taken.append(end)
        turns.append(turn)
        end += 1
    # view_parts numbers the turns by their place in `turns`; the splice wants their index.
    wired = view_parts(turns, dialect.wire([summary, *turns]))
    return [*(taken[p] if isinstance(p, int) else p for p in wired), range(end, known.count)]
