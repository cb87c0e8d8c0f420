"""A request's history as its decision reads it, and what a view of it is estimated at.

The one decision per request (proxy.compacting.decision.conversations, `Conversations.decide`)
reads a `History`: how many items it has, the estimate of its first items, the digest of each prefix,
an item. A parsed list is one (`ListHistory`, counted and hashed when first asked); a long body
remembered from the conversation's last request is another (proxy.compacting.fast, counted off
the loop and extended by what is new). Both count at calibration 1, item by item, and the
request's calibration scales the sum: the two give one estimate by construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from compaction import Checkpoint, HeuristicEstimator, Message, Shape, prefix_digests

if TYPE_CHECKING:
    from proxy.compacting.decision.request import ParsedRequest


class History(Protocol):
    def __len__(self) -> int: ...

    def tokens_to(self, end: int) -> int:
        """The estimate (calibration 1) of items[:end]."""
        ...

    def prefix_digests(self) -> Sequence[bytes]:
        """One per item: digest i identifies items[:i + 1] under the conversation's seed."""
        ...

    def item(self, index: int) -> Message:
        """Item `index` as parsed (for the few a decision or a splice must read)."""
        ...

    def item_bytes(self, index: int) -> int:
        """Item `index`'s length in the client's bytes: what parsing it costs (0: it is parsed
        already)."""
        ...


class ListHistory:
    """A parsed list as a History: counted on first use (its total first: a request below the
    trigger needs no more), hashed when a decision looks a checkpoint up."""

    def __init__(self, items: list[Message], seed: bytes, shape: Shape) -> None:
        self._items = items
        self._seed = seed
        self._shape = shape
        self._counts: list[int] | None = None
        self._total = 0
        self._sums: list[int] | None = None
        self._digests: list[bytes] | None = None

    @classmethod
    def of(cls, request: ParsedRequest) -> ListHistory:
        """The history of a parsed request: its list, under its seed, in its dialect's shape."""
        return cls(request.messages, request.seed, request.dialect.shape)

    def __len__(self) -> int:
        return len(self._items)

    def tokens_to(self, end: int) -> int:
        if self._counts is None:
            self._counts = HeuristicEstimator(shape=self._shape).count_messages(self._items)
            self._total = sum(self._counts)
        if end == len(self._items):
            return self._total
        if self._sums is None:
            self._sums = list(itertools.accumulate(self._counts, initial=0))
        return self._sums[end]

    def prefix_digests(self) -> Sequence[bytes]:
        if self._digests is None:
            self._digests = prefix_digests(self._items, self._seed)
        return self._digests

    def item(self, index: int) -> Message:
        return self._items[index]

    def item_bytes(self, index: int) -> int:
        return 0


def raw_tokens(history: History, base: Checkpoint | None, shape: Shape) -> int:
    """The estimate (calibration 1) of the view `base` gives of `history` (None: the history
    itself): the items its layout keeps before the cut (head, pinned, the run between previews),
    the summary and the previews, and the items after the cut."""
    total = history.tokens_to(len(history))
    if base is None:
        return total
    layout = base.layout
    kept = sum(history.tokens_to(run.stop) - history.tokens_to(run.start) for run in layout.kept)
    summary = base.summary_message
    summary_tokens = (
        0 if summary is None else HeuristicEstimator(shape=shape).count_message(summary)
    )
    own = summary_tokens + (base.preview_tokens(shape) if base.previews else 0)
    return kept + own + total - history.tokens_to(layout.cut)
