"""What a compaction did, as one typed value, and the one place the proxy's own `x-compaction-*`
headers are named and rendered.

The compacting side hands proxy.http an `Outcome` (through proxy.interception's `Exchange`), and a
followup that answered recall calls hands it `RecallFigures`; the relay renders both, with the
proxy's own time, into the client's response headers (`add_headers`), and the session records
(proxy.admin.records) keep the objects themselves: nothing reads a header back. The headers are
documented in docs/operations.md.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

STATUS = "x-compaction-status"
SESSION = "x-compaction-session"
TOKENS_BEFORE = "x-compaction-tokens-before"
TOKENS_AFTER = "x-compaction-tokens-after"
COMPACTION_ID = "x-compaction-id"
REASON = "x-compaction-reason"
"""Why the proxy stepped aside (a compaction the client or provider runs itself)."""
RECALL_ROUNDS = "x-compaction-recall-rounds"
RECALL_TOKENS = "x-compaction-recall-tokens"
RECALL_MS = "x-compaction-recall-ms"
"""The proxy's own time in the recall rounds: what a bench reads to bound a round's cost."""
OVERHEAD = "x-compaction-proxy-overhead-ms"
"""The proxy's own time before forwarding, on every response."""
PURPOSE = "X-Compaction-Purpose"
"""On the proxy's own summarizer calls upstream (summary, memory), never on a client's
response: operators tell their cost apart by it."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the hook did with one request: `status` (none, applied, reused, shadow, failed...),
    the session it belongs to, its token estimates as sent and as forwarded, and the compaction
    it went out with. A field left None is not told (a request left as it came is told its
    status only)."""

    status: str
    session_id: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    compaction_id: str | None = None
    reason: str | None = None
    """Why the request was left alone when the client or the provider compacts it itself."""


UNCHANGED = Outcome("none")
"""The outcome of a request left as it came, unparsed (one value shared by all)."""


@dataclass(frozen=True, slots=True)
class RecallFigures:
    """The recall rounds a followup answered (proxy.recall), what they cost upstream in tokens,
    and the proxy's own time in them."""

    rounds: int
    tokens: int
    proxy_ms: float


def add_headers(
    headers: MutableMapping[str, str],
    outcome: Outcome | None,
    recall: RecallFigures | None = None,
    overhead_ms: float | None = None,
) -> None:
    """Write the headers that tell `outcome`, `recall` and the proxy's `overhead_ms` into
    `headers`, in this order (what is None is left out)."""
    if outcome is not None:
        headers[STATUS] = outcome.status
        if outcome.session_id is not None:
            headers[SESSION] = outcome.session_id
        if outcome.tokens_before is not None:
            headers[TOKENS_BEFORE] = str(outcome.tokens_before)
        if outcome.tokens_after is not None:
            headers[TOKENS_AFTER] = str(outcome.tokens_after)
        if outcome.compaction_id:
            headers[COMPACTION_ID] = outcome.compaction_id
        if outcome.reason:
            headers[REASON] = outcome.reason
    if recall is not None:
        headers[RECALL_ROUNDS] = str(recall.rounds)
        headers[RECALL_TOKENS] = str(recall.tokens)
        headers[RECALL_MS] = f"{recall.proxy_ms:.3f}"
    if overhead_ms is not None:
        headers[OVERHEAD] = f"{overhead_ms:.3f}"
