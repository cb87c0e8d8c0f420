"""Messages on their way to a job (`Packed`), and the packing a plan made kept for the run that
applies it (`LastPacked`).

A job sent to a worker process takes the messages as JSON bytes. A compaction sends the same
history twice, to plan and then to run; packing it is a serialization of the whole history on
the caller's thread (the proxy's event loop: ~5 ms at 2.7 MiB, ~80 ms at 50 MiB), so the run
takes the plan's packing when it is given the very messages the plan packed (the same objects in
the same places: messages are never edited in place, see types.Message).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import is_
from typing import Any

import orjson


@dataclass(frozen=True)
class Packed:
    """Messages on their way to a job: as JSON bytes when they cross to another process (a
    megabyte of JSON pickles as one buffer, where the same messages as objects cost a pickle
    memo entry each, both ways), else the list itself."""

    json: bytes | None
    items: list[Any] | None

    @classmethod
    def of(cls, messages: Sequence[Any], *, crossing: bool) -> Packed:
        if crossing:
            try:
                return cls(orjson.dumps(list(messages)), None)
            except (TypeError, orjson.JSONEncodeError):
                pass  # not plain JSON (an in-process caller's objects): pickled as they are
        return cls(None, list(messages))

    def unpack(self) -> list[Any]:
        if self.json is not None:
            loaded: list[Any] = orjson.loads(self.json)
            return loaded
        return self.items if self.items is not None else []


class LastPacked:
    """The messages the last plan packed and their packing (one history held at a time, and only
    until a run takes it)."""

    def __init__(self) -> None:
        self._messages: tuple[Any, ...] = ()
        self._packed: Packed | None = None

    def pack(self, messages: Sequence[Any], *, crossing: bool) -> Packed:
        """`Packed.of(messages)`, kept for `take` when it crosses to another process."""
        packed = Packed.of(messages, crossing=crossing)
        if crossing:
            self._messages, self._packed = tuple(messages), packed
        return packed

    def take(self, messages: Sequence[Any], *, crossing: bool) -> Packed:
        """The last packing if `messages` holds the objects it packed, in the same places; else
        `Packed.of(messages)`. Either way it is let go: one plan's packing serves one run."""
        known, packed = self._messages, self._packed
        self._messages, self._packed = (), None
        if (
            packed is not None
            and crossing
            and len(messages) == len(known)
            and all(map(is_, messages, known))
        ):
            return packed
        return Packed.of(messages, crossing=crossing)
