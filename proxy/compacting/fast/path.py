"""The fast path of a long conversation's next request: recognized as the continuation of the
last one (proxy.compacting.fast.indexes), and answered without parsing it whenever the one
decision (Conversations.decide, reading the remembered index as the request's history) lets it
go as sent or on a remembered checkpoint, a reserve included (its memory-file items are
written then, once, as on the full path).

Nothing is decided here: what the decision calls for that needs the parsed messages (a
compaction to run, a precompute to start) is left to the full path, and so is a view whose
bytes cannot be spliced from what is remembered. Any dialect: the forwarded list is spliced
from the client's bytes as the full path splices it (Anthropic's joined summary turn included).
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from compaction import Checkpoint, Message
from proxy.compacting.background.workers import WorkerLost
from proxy.compacting.decision.conversations import Conversations, Deadline
from proxy.compacting.decision.exchange import CompactedExchange, ExchangeFactory
from proxy.compacting.decision.precompute import Precompute
from proxy.compacting.decision.request import (
    SCOPE_HEADERS,
    Decision,
    ParsedRequest,
    RequestBuilder,
    opening_of,
)
from proxy.compacting.fast.indexes import BodyIndex, BodyIndexes
from proxy.compacting.fast.parts import Part, splice_view, view_parts
from proxy.dialects import Dialect, NotCompactable
from proxy.interception import RequestContext
from proxy.metrics import CompactionMetrics

log = logging.getLogger(__name__)

# Anthropic's wire joins the summary with the user turns after it; turns alternate, so there are
# a few. More than this (a client that does not alternate) is left to the full path.
_MAX_JOINED = 16


class FastPath:
    """The compacting hook's door into the speed machinery: long requests remembered, the next
    one recognized and answered from what is remembered, forwarded bodies spliced."""

    def __init__(
        self,
        indexes: BodyIndexes,
        *,
        builder: RequestBuilder,
        conversations: Conversations,
        precompute: Precompute,
        metrics: CompactionMetrics,
        exchanges: ExchangeFactory,
    ) -> None:
        self._indexes = indexes
        self._builder = builder
        self._conversations = conversations
        self._precompute = precompute
        self._metrics = metrics
        self._exchanges = exchanges

    def key(self, ctx: RequestContext, dialect: Dialect, body: bytes) -> int | None:
        """The conversation `body` belongs to: its API, the caller's credentials and named
        session (None: too small to remember)."""
        auth = [ctx.headers.get(name, "") for name in SCOPE_HEADERS]
        scope = [dialect.name, ctx.credential or "", ctx.explicit_session or "", *auth]
        return self._indexes.conversation_key("\x00".join(scope), body)

    async def answer(
        self, key: int, ctx: RequestContext, dialect: Dialect, body: bytes
    ) -> tuple[CompactedExchange | None, BodyIndex | None]:
        """The exchange answered from what is remembered (None: the full path answers) and
        the index of `body` (None: not recognized)."""
        seen = self._indexes.recognize(key, body, dialect.items_key)
        if seen is None:
            return None, None
        try:
            dialect.items(seen.fields)  # e.g. a `previous_response_id` after the list
        except NotCompactable:
            return None, None
        remembered, opening = seen.index.fingerprint or (None, None)
        opening_items = seen.index.opening
        if len(opening_items) == seen.index.count and seen.added:
            # No user message among the known items (or only as the last): the first one, which
            # the fingerprint reads, may be among the added ones.
            opening_items = opening_of([*opening_items, *seen.added])
        if opening_items is seen.index.opening and remembered is not None and seen.fields_unchanged:
            # What the opening is read from is as known: the first user turn is not read again
            # (scanning it for injected context cost ~1 ms a request at 400 KB).
            now = remembered
        else:
            now = dialect.opening(seen.fields, opening_items)
        unchanged = now == remembered
        request = self._builder.build(
            ctx, dialect, body, seen.fields, [], opening_items, opening if unchanged else None
        )
        if request.seed != seen.index.seed:
            return None, None
        fingerprint = None if unchanged else (now, request.opening)
        index = self._indexes.extend(key, seen, fingerprint, opening_items)
        try:
            answered = await self._answer(request, index)
        except Exception:  # the full path answers instead
            log.exception("answering a recognized request failed; taking the full path")
            answered = None
        self._metrics.recognized_by("full" if answered is None else "known", dialect.name).inc()
        if answered is None:
            return None, index
        decision, forwarded = answered
        exchange = self._exchanges.build(
            request, decision, forwarded, full=lambda: self._builder.parse(ctx, dialect, body)
        )
        return exchange, index

    async def remember(
        self, key: int, body: bytes, request: ParsedRequest, deadline: Deadline
    ) -> BodyIndex | None:
        """Index a parsed request (the next of its conversation is then recognized), within
        the request's `deadline`: a worker that does not index it in time (stuck, or busy)
        costs the request its speed, never its answer."""
        dialect = request.dialect
        opening = opening_of(request.messages)
        try:
            learned = self._indexes.learn(
                key,
                body,
                len(request.messages),
                items_key=dialect.items_key,
                shape=dialect.shape,
                seed=request.seed,
                opening=opening,
                fingerprint=(dialect.opening(request.payload, opening), request.opening),
            )
            return await asyncio.wait_for(learned, deadline.left())
        except (TimeoutError, WorkerLost):  # a worker lost is logged where it was found
            return None
        except Exception:  # only the next request's speed depends on it
            log.exception("remembering a long request failed")
            return None

    def forwarded_body(
        self, request: ParsedRequest, view: list[Message], index: BodyIndex | None
    ) -> bytes | None:
        """`request`'s body with its list replaced by `view`, kept items as the client's bytes
        whether or not the body is remembered (None: its bytes cannot be followed)."""
        wire = request.dialect.wire(view)
        if index is not None:
            return index.splice(view_parts(request.messages, wire))
        return splice_view(request.body, request.dialect.items_key, request.messages, wire)

    async def _answer(
        self, request: ParsedRequest, index: BodyIndex
    ) -> tuple[Decision, bytes] | None:
        """The decision for `request` and the body it forwards, when neither needs the parsed
        messages; None otherwise."""
        conversations = self._conversations
        choice = await conversations.decide(request, index)
        if choice.stepped_aside is not None:
            aside = choice.stepped_aside
            return Decision([], "skipped", choice.before, choice.before, None, aside), index.body
        if choice.compacts or self._precompute.would_start(request, choice.after, choice.before):
            return None  # a compaction to run, a precompute to start: they read the messages
        if choice.base is None:
            return Decision([], "none", choice.before, choice.before, None), index.body
        if conversations.thinking.applies(request.dialect, request.model):
            return None  # the thinking its prefix binds is read from the parsed messages
        parts = _wire_parts(index, choice.base, request.dialect)
        if parts is None:
            return None
        checkpoint = choice.base
        status = await conversations.substituted(checkpoint.compaction_id)
        decision = Decision([], status, choice.before, choice.after, checkpoint.compaction_id)
        return decision, index.splice(parts)


def _wire_parts(index: BodyIndex, checkpoint: Checkpoint, dialect: Dialect) -> list[Part] | None:
    """Checkpoint.apply then Dialect.wire, as splice parts: the bytes the full path splices."""
    summary = checkpoint.summary_message
    if summary is not None and dialect.native is not None and dialect.native.has_native([summary]):
        # A native block joins the kept assistant turn after it, which only the full path reads:
        # wired from the summary alone it would stand as a turn of its own, a new prefix.
        return None
    if summary is not None and dialect.joins_summary:
        # Anthropic joins a summary with the turns after it: with previews too, the full path.
        return None if checkpoint.previews else _joined(index, checkpoint, summary, dialect)
    if summary is None and not checkpoint.previews:
        return None
    return [
        part if isinstance(part, (int, range)) else orjson.dumps(part)
        for part in checkpoint.layout.parts_of(index.count)
    ]


def _joined(
    index: BodyIndex, checkpoint: Checkpoint, summary: Message, dialect: Dialect
) -> list[Part] | None:
    """The wire joins the summary with the user turns right after it: only those are read. A
    head before the summary would have to be read too (Anthropic's head is its top-level
    `system`)."""
    if checkpoint.head_end:
        return None
    taken = list(checkpoint.pinned)
    turns = [index.item(i) for i in taken]
    end = checkpoint.cut
    while end < index.count:
        if len(taken) >= _MAX_JOINED:
            return None
        turn = index.item(end)
        if not (isinstance(turn, dict) and turn.get("role") == "user"):
            break
        taken.append(end)
        turns.append(turn)
        end += 1
    # view_parts numbers the turns by their place in `turns`; the splice wants their index.
    wired = view_parts(turns, dialect.wire([summary, *turns]))
    return [*(taken[p] if isinstance(p, int) else p for p in wired), range(end, index.count)]
