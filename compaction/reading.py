"""The Items an inline plan read (and the tokens it counted), handed on to the run that
applies the plan.

`Compactor.plan` reads every message into an Item and counts its tokens to cut the list;
`Compactor.run` reads and counts the folded ones again to fold them. In process the run takes
them from here instead, when it is given the very list the plan read (the same message objects
in the same places; messages are never edited in place, see types.Message) and counts with the
same estimator. A job sent to a worker process reads for itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import is_
from typing import Any, NamedTuple

from compaction.messages import Item, Shape, read_items
from compaction.types import TokenEstimator


class Taken(NamedTuple):
    """What a run takes from the plan: the Items of the messages it asked for, and their token
    counts when the plan counted with the estimator the run counts with (else None)."""

    items: list[Item]
    counts: list[int] | None


class LastRead:
    """The messages the last inline plan read, their Items and token counts (one list held at
    a time)."""

    def __init__(self) -> None:
        self._messages: tuple[Any, ...] = ()
        self._items: list[Item] = []
        self._shape: Shape | None = None
        self._counts: list[int] = []
        self._estimator: TokenEstimator | None = None

    def read(self, messages: Sequence[Any], shape: Shape) -> list[Item]:
        """`read_items(messages, shape)`, kept for `take`."""
        items = read_items(messages, shape)
        self._messages, self._items, self._shape = tuple(messages), items, shape
        self._counts, self._estimator = [], None
        return items

    def counted(self, counts: list[int], estimator: TokenEstimator) -> None:
        """The token counts of the messages read, by `estimator`, kept for `take`."""
        self._counts, self._estimator = counts, estimator

    def take(
        self,
        messages: Sequence[Any],
        indices: Iterable[int],
        shape: Shape,
        estimator: TokenEstimator | None = None,
    ) -> Taken | None:
        """The Items (and counts by `estimator`) of `messages[i]` for each of `indices` if
        `messages` holds the objects read last, in the same places and shape; else None (the
        caller reads them). Either way they are let go: one plan's reading serves one run, and
        holds no history longer."""
        known, items, counts = self._messages, self._items, self._counts
        counted = estimator is not None and estimator is self._estimator and bool(counts)
        self._messages, self._items, self._counts, self._estimator = (), [], [], None
        if shape is not self._shape or len(messages) != len(known):
            return None
        if not all(map(is_, messages, known)):
            return None
        indices = list(indices)
        return Taken([items[i] for i in indices], [counts[i] for i in indices] if counted else None)
