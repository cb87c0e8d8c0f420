"""The decision for a request recognized as the continuation of a known one (proxy.compacting.
known), made from what is remembered: no full parse, no re-hashing, no re-counting.

It settles the two cases that are most requests of a long conversation: below the trigger with
nothing to do (`none`), and a remembered checkpoint whose view fits (`reused`). Everything else
(a compaction to run, a precompute to start, a reserve checkpoint, an estimate too close to the
trigger to trust the per-item rounding) is left to the full path: `decide` returns None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from compaction import HeuristicEstimator
from compaction.checkpoints import Checkpoint
from compaction.tokens import REPLY_PRIMING_TOKENS
from proxy.compacting.calibration import Calibration
from proxy.compacting.conversations import Conversations
from proxy.compacting.exchange import CompactedExchange, describe
from proxy.compacting.known import Known, KnownRequests, Part
from proxy.compacting.overflow import LearnedWindows
from proxy.compacting.precompute import Precompute
from proxy.compacting.request import Decision, ParsedRequest
from proxy.hook import RequestContext
from proxy.metrics import CompactionMetrics

log = logging.getLogger(__name__)

# Headers that scope a conversation besides Authorization (as proxy.compacting.hook sends them).
_SCOPE_HEADERS = ("api-key", "x-api-key", "OpenAI-Organization", "OpenAI-Project")
ChatOf = Callable[[dict[str, Any], list[Any], str | None], ParsedRequest]
"""The hook's request from (fields without the messages, opening messages, known fingerprint)."""

# The remembered counts are per item at calibration 1 and scaled as a sum, the full path rounds
# per item: within this margin of the trigger the full path decides.
_TRIGGER_MARGIN = 1.01


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
        conversations: Conversations,
        precompute: Precompute,
        metrics: CompactionMetrics,
        calibration: Calibration,
        learned: LearnedWindows,
    ) -> None:
        self._known = known
        self._conversations = conversations
        self._precompute = precompute
        self._metrics = metrics
        self._calibration = calibration
        self._learned = learned

    def key(self, ctx: RequestContext, body: bytes) -> bytes | None:
        """The conversation `body` belongs to: the caller's credentials and named session."""
        auth = [ctx.headers.get(name, "") for name in _SCOPE_HEADERS]
        scope = "\x00".join([ctx.credential or "", ctx.explicit_session or "", *auth])
        return self._known.conversation_key(scope, body)

    async def recall(
        self, key: bytes, body: bytes, chat_of: ChatOf, parse: Callable[[], ParsedRequest]
    ) -> tuple[CompactedExchange | None, Known | None]:
        """The exchange decided from what is known (None: the full path decides) and what is
        known of `body` (None: not recognized)."""
        seen = self._known.recognize(key, body)
        if seen is None:
            return None, None
        tools, opening = seen.known.fingerprint or (None, None)
        chat = chat_of(
            seen.fields, seen.known.opening, opening if seen.fields.get("tools") == tools else None
        )
        if chat.seed != seen.known.seed:
            return None, None
        known = self._known.extend(key, seen)
        try:
            recalled = await decide(chat, known, self._conversations, self._precompute)
        except Exception:  # the full path decides instead
            log.exception("deciding from a known request failed; taking the full path")
            return None, known
        if recalled is None:
            return None, known
        self._metrics.decisions.labels(status=recalled.status, dialect=chat.dialect.name).inc()
        compaction_id = recalled.checkpoint.compaction_id if recalled.checkpoint else None
        decision = Decision(
            [], recalled.status, recalled.tokens_before, recalled.tokens_after, compaction_id
        )
        exchange = CompactedExchange(
            chat,
            body=recalled.body,
            tokens=recalled.tokens_after,
            headers=describe(chat, decision),
            conversations=self._conversations,
            calibration=self._calibration,
            learned=self._learned,
            metrics=self._metrics,
            full=parse,
        )
        return exchange, known

    async def learn(self, key: bytes, body: bytes, chat: ParsedRequest) -> Known | None:
        """Remember a parsed request (the next of its conversation is then recognized)."""
        try:
            return await self._known.learn(
                key,
                body,
                len(chat.messages),
                seed=chat.seed,
                opening=opening_of(chat.messages),
                fingerprint=(chat.payload.get("tools"), chat.opening),
            )
        except Exception:  # only the next request's speed depends on it
            log.exception("remembering a long request failed")
            return None


async def decide(
    chat: ParsedRequest, known: Known, conversations: Conversations, precompute: Precompute
) -> Recalled | None:
    fixed = chat.estimator.count_tools(chat.extras) + REPLY_PRIMING_TOKENS
    before = estimate_known(chat, known)
    checkpoint = await conversations.latest(known.digests, known.count)
    if checkpoint is not None and checkpoint.precomputed:
        # Held in reserve until the view it extends reaches the trigger (Conversations.view):
        # that view is what goes out meanwhile; the reserve's turn is the full path's.
        digests = known.request_digests()
        checkpoint = await conversations.stored(digests, checkpoint.parent)
        parent_after = _after(chat, known, checkpoint, before, fixed)
        if conversations.needs(chat, parent_after):
            return None
    if checkpoint is None:
        after, parts = before, None
    elif checkpoint.cut > known.count:
        return None
    else:
        after = round(_view_tokens(known, checkpoint) * chat.factor) + fixed
        parts = _view_parts(known, checkpoint)
    if checkpoint is None and conversations.needs(chat, before):
        return None
    if conversations.needs(chat, int(after * _TRIGGER_MARGIN) + 1):
        return None
    if precompute.would_start(chat, after, before):
        return None
    if parts is None:
        return Recalled("none", before, after, None, known.body)
    status = await conversations.substituted(checkpoint.compaction_id)  # type: ignore[union-attr]
    return Recalled(status, before, after, checkpoint, known.splice(parts))


def _after(
    chat: ParsedRequest, known: Known, checkpoint: Checkpoint | None, before: int, fixed: int
) -> int:
    if checkpoint is None:
        return before
    return round(_view_tokens(known, checkpoint) * chat.factor) + fixed


def estimate_known(chat: ParsedRequest, known: Known) -> int:
    """The request's estimate from the remembered counts (the full path's, up to rounding)."""
    fixed = chat.estimator.count_tools(chat.extras) + REPLY_PRIMING_TOKENS
    return round(known.tokens[known.count] * chat.factor) + fixed


def _view_tokens(known: Known, checkpoint: Checkpoint) -> int:
    tokens = known.tokens
    pinned = sum(tokens[i + 1] - tokens[i] for i in checkpoint.pinned)
    summary = HeuristicEstimator().count_message(checkpoint.summary_message)
    kept = tokens[known.count] - tokens[checkpoint.cut]
    return tokens[checkpoint.head_end] + summary + pinned + kept


def _view_parts(known: Known, checkpoint: Checkpoint) -> list[Part]:
    """Checkpoint.apply, as splice parts (the same bytes the full path would splice)."""
    return [
        *range(checkpoint.head_end),
        orjson.dumps(checkpoint.summary_message),
        *checkpoint.pinned,
        *range(checkpoint.cut, known.count),
    ]


def opening_of(messages: list[Any]) -> list[Any]:
    """The messages a fingerprint reads: up to and including the first user message."""
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: i + 1]
    return messages
