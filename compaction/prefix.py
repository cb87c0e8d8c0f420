"""A prefix of a list of digests, read in place."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any, overload


class Prefix(Sequence[bytes]):
    """The first `count` digests of a list, as a sequence, without a copy: a slice of a long
    history's digests copies tens of thousands of references on every request. Iterated, in
    either direction, at C speed (the stores walk a request's digests newest first)."""

    __slots__ = ("_count", "_digests")

    def __init__(self, digests: Sequence[bytes], count: int) -> None:
        self._count = max(0, min(count, len(digests)))
        if isinstance(digests, Prefix):  # the list under it
            self._digests: list[bytes] = digests._digests
        elif isinstance(digests, list):
            self._digests = digests
        else:  # another sequence: made a list once
            self._digests = list(digests)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return self._digests[: self._count][index]
        position = index + self._count if index < 0 else index
        if not 0 <= position < self._count:
            raise IndexError("prefix index out of range")
        return self._digests[position]

    def __iter__(self) -> Iterator[bytes]:
        return islice(self._digests, self._count)

    def __reversed__(self) -> Iterator[bytes]:
        return islice(reversed(self._digests), len(self._digests) - self._count, None)

    def __contains__(self, value: object) -> bool:
        try:
            self.index(value)
        except ValueError:
            return False
        return True

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        begin, end, _ = slice(start, stop).indices(self._count)  # negatives count from its end
        return self._digests.index(value, begin, end)
