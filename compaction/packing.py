"""Messages on their way to a job (`Packed`), and the packing a plan made kept for the run that
applies it (`Packings`).

A job sent to a worker process takes the messages as JSON bytes. A compaction sends the same
history twice, to plan and then to run; packing it is a serialization of the whole history on
the caller's thread (the proxy's event loop: ~5 ms at 2.7 MiB, 60–70 ms at 50 MiB), so the run
takes the plan's packing when it is given the very messages the plan packed (the same objects in
the same places: messages are never edited in place, see types.Message). A caller that has the
messages as JSON already (the proxy: its client's bytes) gives them to the plan, and the history
is not serialized at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import is_
from typing import Any
from weakref import WeakKeyDictionary

import orjson

from compaction.types import Plan


@dataclass(frozen=True)
class JsonArray:
    """A JSON array as its holder has it: `data[start:end]`. `data` may be a larger document
    (the request body the proxy read): sent to a job as it is, never copied out on the caller's
    thread (a fresh copy of 50 MiB costs the event loop about 60 ms, page faults included)."""

    data: bytes
    start: int = 0
    end: int | None = None

    def load(self) -> list[Any]:
        loaded: list[Any] = orjson.loads(memoryview(self.data)[self.start : self.end])
        return loaded


@dataclass(frozen=True)
class Packed:
    """Messages on their way to a job: as JSON when they cross to another process (a megabyte
    of JSON pickles as one buffer, where the same messages as objects cost a pickle memo entry
    each, both ways), else the list itself."""

    json: JsonArray | None
    items: list[Any] | None

    @classmethod
    def of(
        cls, messages: Sequence[Any], *, crossing: bool, json: JsonArray | None = None
    ) -> Packed:
        """`messages` packed for a job; `json`, their JSON array if the caller has it already."""
        if crossing:
            if json is not None:
                return cls(json, None)
            try:
                return cls(JsonArray(orjson.dumps(list(messages))), None)
            except (TypeError, orjson.JSONEncodeError):
                pass  # not plain JSON (an in-process caller's objects): pickled as they are
        return cls(None, list(messages))

    def unpack(self) -> list[Any]:
        if self.json is not None:
            return self.json.load()
        return self.items if self.items is not None else []


class Packings:
    """Each plan's packing of the messages it was made from, for the run that applies it: kept
    as long as the plan lives (a plan that is never run takes its packing with it) and taken
    once. Every plan has its own, so concurrent compactions of other sessions do not displace
    it."""

    def __init__(self) -> None:
        self._by_plan: WeakKeyDictionary[Plan, tuple[tuple[Any, ...], Packed]] = WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._by_plan)

    def keep(self, plan: Plan, messages: Sequence[Any], packed: Packed) -> None:
        """Keep `packed`, made from `messages`, for the run of `plan` (JSON only: a packing that
        does not cross is the list itself, nothing to save)."""
        if packed.json is not None:
            self._by_plan[plan] = (tuple(messages), packed)

    def take(self, plan: Plan, messages: Sequence[Any], *, crossing: bool) -> Packed:
        """The packing kept for `plan` if `messages` holds the objects it was made from, in the
        same places; else `Packed.of(messages)`."""
        known, packed = self._by_plan.pop(plan, ((), None))
        if packed is not None and len(messages) == len(known) and all(map(is_, messages, known)):
            return packed
        return Packed.of(messages, crossing=crossing)
