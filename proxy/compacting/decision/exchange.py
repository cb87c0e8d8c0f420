"""One compacted request from the upstream's point of view: what went out last, the one
retry after a context-length error, and calibration from the usage the upstream reports.

A `CompactedExchange` is the proxy.interception.Exchange of a parsed request; it is mutable on
purpose (like a flow): the retry replaces what was sent, and calibration reads what was sent last.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from proxy.compacting.decision.conversations import Conversations
from proxy.compacting.decision.history import ListHistory
from proxy.compacting.decision.request import Decision, ParsedRequest
from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.overflow import LearnedWindows, parse_overflow
from proxy.interception import Exchange, Followup, Passthrough
from proxy.metrics import CompactionMetrics
from proxy.outcome import Outcome
from proxy.recall import Recall

log = logging.getLogger(__name__)

# After an overflow without numbers, assume we under-counted by this much.
_OVERFLOW_BUMP = 1.25
# Aim this far under an overflow's stated limit on the retry.
_OVERFLOW_MARGIN = 0.9


class CompactedExchange:
    wants_usage = True

    def __init__(
        self,
        request: ParsedRequest,
        *,
        body: bytes,
        tokens: int,
        outcome: Outcome,
        conversations: Conversations,
        calibration: Calibration,
        learned: LearnedWindows,
        metrics: CompactionMetrics,
        full: Callable[[], Awaitable[ParsedRequest]] | None = None,
    ) -> None:
        """`full` parses the whole request when `request` was built without its messages (a
        recognized continuation, proxy.compacting.fast.path): only a retry needs them."""
        self._request = request
        self._full = full
        self._body = body
        self._tokens = tokens
        self._outcome = outcome
        self._conversations = conversations
        self._calibration = calibration
        self._learned = learned
        self._metrics = metrics
        self._retried = False
        self._recall: Recall | None = None
        self._followup: Followup | None = None
        self._plain: tuple[bytes, int] | None = None
        """The body and estimate before the recall tool was added."""

    @property
    def body(self) -> bytes:
        return self._body

    @property
    def followup(self) -> Followup | None:
        return self._followup

    @property
    def upstream_headers(self) -> Mapping[str, str]:
        native = self._request.dialect.native
        if native is None or self._outcome.compaction_id is None:
            return {}  # only a compacted body can carry a block of the proxy's
        return native.beta_for(self._body, self._request.headers)

    def offer_recall(self, recall: Recall) -> None:
        """Send the request with the recall tool (proxy.recall), and answer its calls; a retry
        carries it too."""
        self._recall = recall
        self._equip()

    def _equip(self) -> None:
        if self._recall is None:
            return
        equipped = self._recall.equip(self._request, self._body, self._tokens)
        if equipped is not None:
            self._plain = (self._body, self._tokens)
            self._body, self._followup = equipped.body, equipped.rounds
            self._tokens += equipped.added_tokens

    def _without_recall(self, status: int) -> bytes | None:
        """The request without the recall tool, after an upstream refused it with a 400 that is
        not about its length (a backend without tool calling): once, and never again for it."""
        if status != 400 or self._followup is None or self._plain is None:
            return None
        (self._body, self._tokens), self._followup = self._plain, None
        self._recall, self._retried = None, True
        self._metrics.recall_refused.inc()
        log.info(
            "upstream refused the request with the recall tool; retrying once without it",
            extra={"session": self._request.session_id},
        )
        return self._body

    async def _without_bound_thinking(self) -> bytes | None:
        """The request without the thinking of its kept turns, after the upstream refused a
        thinking block whose prefix the compaction changed (a model not configured in
        `models.preserved_thinking`): learned, so the model's next compacted requests carry
        none of it, and retried once; the client never sees that 400."""
        if self._full is not None:
            self._request, self._full = await self._full(), None
        request = self._request
        dialect = request.dialect
        if not dialect.has_thinking:
            return None
        body, tokens = self._plain or (self._body, self._tokens)
        payload, messages = dialect.parse(body)
        kept = [dialect.without_thinking(m) or m for m in messages]
        kept = [m for m in kept if m.get("content")]  # a turn of thinking alone goes
        compaction_id = self._outcome.compaction_id
        await self._conversations.thinking.learn(
            request.model, compaction_id, len(request.messages)
        )
        self._body, self._tokens = dialect.serialize(body, payload, kept), tokens
        self._followup, self._plain, self._retried = None, None, True
        self._equip()
        self._metrics.thinking_refused.inc()
        log.info(
            "upstream refused a thinking block whose prefix changed; retrying once without",
            extra={"session": request.session_id},
        )
        return self._body

    @property
    def outcome(self) -> Outcome:
        return self._outcome

    @property
    def session_id(self) -> str:
        return self._request.session_id

    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        if self._retried:
            return None
        if self._request.dialect.refuses_bound_thinking(status, body):
            return await self._without_bound_thinking()
        overflow = parse_overflow(status, body)
        if overflow is None:
            return self._without_recall(status)
        if self._full is not None:
            self._request, self._full = await self._full(), None
        request = self._request
        raw_forwarded = self._tokens / request.factor
        if overflow.requested and raw_forwarded > 0:
            factor = self._calibration.raise_at_least(
                request.model, overflow.requested / raw_forwarded
            )
        else:
            factor = self._calibration.raise_at_least(
                request.model, request.factor * _OVERFLOW_BUMP
            )
        if overflow.limit:
            # The upstream's word on its own limit is believed, and remembered for the model.
            self._learned.learn(request.model, overflow.limit, request.window)
            window = min(request.window, int(overflow.limit * _OVERFLOW_MARGIN))
        else:
            # No number: the window is no larger than what was just refused.
            window = min(request.window, max(1, int(self._tokens * _OVERFLOW_MARGIN)))
        harder = request.with_budget(window=window, factor=factor)
        self._metrics.overflow_retries.inc()
        try:
            history = ListHistory.of(harder)
            before = self._conversations.estimate(harder, history)
            decision = await self._conversations.compact_after_overflow(harder, history, before)
        except Exception:
            log.exception("compaction after a context-length error failed")
            self._metrics.errors.inc()
            return None
        decision = self._conversations.thinking.forwarded(harder, decision)
        retry = harder.serialize(decision.messages)
        if decision.status not in ("applied", "reused") or len(retry) >= len(self._body):
            return None  # nothing smaller to send: relay the upstream's error
        self._request, self._tokens, self._body = harder, decision.tokens_after, retry
        self._outcome = describe(harder, decision)  # the outcome tells what went out last
        self._retried = True
        self._equip()
        log.info(
            "upstream reported a context overflow; retrying once compacted",
            extra={"session": request.session_id, "tokens_after": decision.tokens_after},
        )
        return self._body

    @property
    def tokens_before(self) -> int:
        """The estimate of the request as the client sent it."""
        return self._outcome.tokens_before or 0  # describe() always tells it

    def observe(self, status: int, usage: dict[str, Any] | None) -> None:
        self.calibrate(status, usage, self._tokens)

    def calibrate(self, status: int, usage: dict[str, Any] | None, tokens: int) -> None:
        """Calibrate the model's estimates from the upstream's `usage` of a request estimated
        at `tokens`."""
        if status != 200:
            return
        request = self._request
        prompt_tokens = request.dialect.prompt_tokens(usage or {})
        if prompt_tokens is not None and tokens > 0:
            self._calibration.observe(request.model, round(tokens / request.factor), prompt_tokens)


class ExchangeFactory:
    """Builds the CompactedExchange of a decision, over what every one of them shares: the one
    place a decision becomes an exchange (full path and fast path alike)."""

    def __init__(
        self,
        *,
        conversations: Conversations,
        calibration: Calibration,
        learned: LearnedWindows,
        metrics: CompactionMetrics,
    ) -> None:
        self._conversations = conversations
        self._calibration = calibration
        self._learned = learned
        self._metrics = metrics

    def build(
        self,
        request: ParsedRequest,
        decision: Decision,
        body: bytes,
        full: Callable[[], Awaitable[ParsedRequest]] | None = None,
    ) -> CompactedExchange:
        """The exchange that forwards `body`, `decision`'s view of `request` (`full`: see
        CompactedExchange)."""
        return CompactedExchange(
            request,
            body=body,
            tokens=decision.tokens_after,
            outcome=describe(request, decision),
            conversations=self._conversations,
            calibration=self._calibration,
            learned=self._learned,
            metrics=self._metrics,
            full=full,
        )


class ShadowExchange:
    """A compaction computed and recorded (`computed`) whose request goes upstream as the
    client sent it (`original`, compaction.mode: shadow). The client is told `shadow` and what
    `on` would have forwarded (tokens after, compaction id); the upstream's usage calibrates the
    original's estimate, and an error is relayed: nothing is retried in shadow."""

    wants_usage = True
    followup = None
    upstream_headers: Mapping[str, str] = {}

    def __init__(self, computed: CompactedExchange, original: bytes) -> None:
        self._computed = computed
        self._original = original
        self._outcome = replace(computed.outcome, status="shadow")

    @property
    def body(self) -> bytes:
        return self._original

    @property
    def outcome(self) -> Outcome:
        return self._outcome

    @property
    def session_id(self) -> str:
        return self._computed.session_id

    async def retry_after_error(self, status: int, body: bytes) -> bytes | None:
        return None

    def observe(self, status: int, usage: dict[str, Any] | None) -> None:
        self._computed.calibrate(status, usage, self._computed.tokens_before)


def describe(request: ParsedRequest, decision: Decision) -> Outcome:
    """The outcome the client is told of `decision` on `request`."""
    return Outcome(
        decision.status,
        request.session_id,
        decision.tokens_before,
        decision.tokens_after,
        decision.compaction_id or None,
        decision.stepped_aside,
    )


class UnparsedExchange:
    """The exchange of a request forwarded unparsed: passes through, unless the upstream
    answers a context-length error; then `retry` parses and compacts it, and the exchange that
    made the retry speaks for the request from then on (outcome, calibration)."""

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
    def outcome(self) -> Outcome | None:
        return self._current.outcome

    @property
    def session_id(self) -> str | None:
        return self._current.session_id

    @property
    def wants_usage(self) -> bool:
        return self._current.wants_usage

    @property
    def followup(self) -> Followup | None:
        return self._current.followup

    @property
    def upstream_headers(self) -> Mapping[str, str]:
        return self._current.upstream_headers

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
