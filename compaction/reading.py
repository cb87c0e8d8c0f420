"""The Items an inline plan read, handed on to the run that applies the plan.

`Compactor.plan` reads every message into an Item to cut the list; `Compactor.run` reads the
folded ones again to fold them. In process the run takes them from here instead, when it is given
the very list the plan read (the same message objects in the same places; messages are never
edited in place, see types.Message). A job sent to a worker process reads for itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import is_
from typing import Any

from compaction.messages import Item, Shape, read_items


class LastRead:
    """The messages the last inline plan read, and their Items (one list held at a time)."""

    def __init__(self) -> None:
        self._messages: tuple[Any, ...] = ()
        self._items: list[Item] = []
        self._shape: Shape | None = None

    def read(self, messages: Sequence[Any], shape: Shape) -> list[Item]:
        """`read_items(messages, shape)`, kept for `take`."""
        items = read_items(messages, shape)
        self._messages, self._items, self._shape = tuple(messages), items, shape
        return items

    def take(
        self, messages: Sequence[Any], indices: Iterable[int], shape: Shape
    ) -> list[Item] | None:
        """The Items of `messages[i]` for each of `indices` if `messages` holds the objects
        read last, in the same places and shape; else None (the caller reads them). Either way
        they are let go: one plan's reading serves one run, and holds no history longer."""
        known, items = self._messages, self._items
        self._messages, self._items = (), []
        if shape is not self._shape or len(messages) != len(known):
            return None
        if not all(map(is_, messages, known)):
            return None
        return [items[i] for i in indices]
