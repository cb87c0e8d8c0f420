"""Checkpoints: remembering a compaction so the same history is never summarized twice.

Agents resend their whole history on every call. A checkpoint records how the prefix
`messages[:cut]` of one conversation was compacted, under a digest of exactly that prefix (chained
from a seed that carries the caller's credential and session, so tenants never share). The next
request of the conversation finds its longest remembered prefix, substitutes the same summary
message (byte-stable, so upstream prompt caches keep hitting) and, only if still too large, extends
it: the summary then sits inside the folded span and the library writes an updated summary.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol, overload

import orjson
from cachetools import TTLCache

from compaction.types import CompactionResult, MemoryItem, Message, Plan, as_memory_type

_DIGEST_SIZE = 16


def conversation_seed(*parts: str) -> bytes:
    """The chain's starting digest: the caller's credential, session, anything that scopes reuse."""
    hasher = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    for part in parts:
        hasher.update(part.encode("utf-8", "surrogatepass"))
        hasher.update(b"\x00")
    return hasher.digest()


def prefix_digests(messages: Sequence[Message], seed: bytes) -> list[bytes]:
    """digests[i] identifies messages[:i + 1] under `seed` (key order inside a message ignored)."""
    digests: list[bytes] = []
    current = seed
    for message in messages:
        body = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        current = hashlib.blake2b(current + body, digest_size=_DIGEST_SIZE).digest()
        digests.append(current)
    return digests


class DigestPrefix(Sequence[bytes]):
    """The first `count` digests of a list, as a sequence, without a copy: a slice of a long
    history's digests copies tens of thousands of references on every request. Iterated, in
    either direction, at C speed (the stores walk a request's digests newest first)."""

    __slots__ = ("_count", "_digests")

    def __init__(self, digests: Sequence[bytes], count: int) -> None:
        self._count = max(0, min(count, len(digests)))
        if isinstance(digests, DigestPrefix):  # the list under it
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


@dataclass(frozen=True)
class Checkpoint:
    """`messages[:cut]` of a conversation becomes head + summary + pinned messages.

    Only the summary message is stored; head and pinned messages are taken from each request
    (their content is the same by the digest), so the agent's own bytes go upstream.
    """

    key: bytes
    cut: int
    head_end: int
    pinned: tuple[int, ...]
    summary_message: Message
    compaction_id: str
    path: str
    parent: bytes | None = None
    """Key of the checkpoint this one extended (None: it compacted the original history)."""
    precomputed: bool = False
    """Prepared ahead of the trigger: held in reserve until the parent's view reaches it."""
    memory_items: tuple[MemoryItem, ...] = ()
    """A reserve's memory items, written to the memory file when it is applied, not before (a
    conversation that never reaches the trigger must not leave memory behind)."""

    def apply(self, messages: Sequence[Message]) -> list[Message]:
        """The compacted view of a request whose first `cut` messages match this checkpoint."""
        return [
            *messages[: self.head_end],
            self.summary_message,
            *(messages[i] for i in self.pinned),
            *messages[self.cut :],
        ]

    @property
    def prefix_len(self) -> int:
        """Length of what replaces messages[:cut] in the view."""
        return self.head_end + 1 + len(self.pinned)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (digests in hex) that `from_json` reads back, tagged with a version."""
        return {
            "version": CHECKPOINT_VERSION,
            "key": self.key.hex(),
            "cut": self.cut,
            "head_end": self.head_end,
            "pinned": list(self.pinned),
            "summary_message": self.summary_message,
            "compaction_id": self.compaction_id,
            "path": self.path,
            "parent": self.parent.hex() if self.parent is not None else None,
            "precomputed": self.precomputed,
            "memory_items": [[i.type, i.content] for i in self.memory_items],
        }

    @classmethod
    def from_json(cls, data: object) -> Checkpoint:
        """The checkpoint `to_json` wrote; ValueError for another version or malformed data (a
        store treats that as a miss)."""
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
            raise ValueError("not a checkpoint of a known version")
        try:
            checkpoint = cls(
                key=bytes.fromhex(data["key"]),
                cut=_non_negative(data["cut"]),
                head_end=_non_negative(data["head_end"]),
                pinned=tuple(_non_negative(i) for i in data["pinned"]),
                summary_message=data["summary_message"],
                compaction_id=str(data["compaction_id"]),
                path=str(data["path"]),
                parent=bytes.fromhex(data["parent"]) if data["parent"] is not None else None,
                precomputed=bool(data["precomputed"]),
                memory_items=tuple(
                    MemoryItem(as_memory_type(str(t)), str(c))
                    for t, c in data.get("memory_items", [])
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed checkpoint: {exc}") from exc
        if not isinstance(checkpoint.summary_message, dict) or checkpoint.cut <= 0:
            raise ValueError("malformed checkpoint: no summary message or an empty prefix")
        return checkpoint


CHECKPOINT_VERSION = 1


def _non_negative(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


class CheckpointStore(Protocol):
    """Where checkpoints live, for a process or shared between replicas: async, and batched so
    a remote store answers a request in one round trip.

    `longest(digests)`: `digests[i]` is the digest of a prefix of `i + 1` messages; the
    checkpoint whose key is the latest of them and whose `cut` is `i + 1`, or None. A stored
    entry that does not read back (`Checkpoint.from_json` raising ValueError) is a miss.
    `put(checkpoint)` stores it under `checkpoint.key`; a store may evict what it likes.
    """

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None: ...

    async def put(self, checkpoint: Checkpoint) -> None: ...


class CheckpointCache:
    """A bounded in-process table, looked up one key at a time: least recently used entries go
    first, each lives `ttl_s`. Synchronous, for in-process users of the library; the proxy's
    async `CheckpointStore` over it is proxy.compacting.stores.local."""

    def __init__(
        self,
        max_entries: int = 10_000,
        ttl_s: float = 6 * 3600,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache: TTLCache[bytes, Checkpoint] = TTLCache(max_entries, ttl_s, timer=timer)
        # Every key put, some since expired or evicted: a C-speed first filter for `longest`
        # (a request holds thousands of digests; looking each up in the TTL cache costs more).
        self._keys: set[bytes] = set()

    def get(self, key: bytes) -> Checkpoint | None:
        return self._cache.get(key)

    def put(self, checkpoint: Checkpoint) -> None:
        self._cache[checkpoint.key] = checkpoint
        if len(self._keys) > 2 * len(self._cache) + 64:
            self._keys = set(self._cache.keys())
        self._keys.add(checkpoint.key)

    def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        """`longest_of(self.get, digests)`, looking up only the digests ever put."""
        # Longest first: the digests never put are skipped at C speed, and the walk stops at the
        # first live checkpoint (a reused request's ends a window's worth of items from the end).
        # A key found is checked where its cut says (chained digests never repeat in a request).
        for key in filter(self._keys.__contains__, reversed(digests)):
            found = self._cache.get(key)
            if (
                found is not None
                and 0 < found.cut <= len(digests)
                and digests[found.cut - 1] == key
            ):
                return found
        return None

    def __len__(self) -> int:
        return len(self._cache)


def find_longest(store: CheckpointCache, digests: Sequence[bytes]) -> Checkpoint | None:
    """The checkpoint of the longest remembered prefix of a request, None when no prefix is.

    The last message is never part of a checkpoint (it is the new turn), so the search starts one
    before it.
    """
    return longest_of(store.get, digests[:-1])


def longest_of(
    get: Callable[[bytes], Checkpoint | None], digests: Sequence[bytes]
) -> Checkpoint | None:
    """`CheckpointStore.longest` over a key lookup: the latest digest whose checkpoint has the
    cut that digest stands for."""
    for cut in range(len(digests), 0, -1):
        found = get(digests[cut - 1])
        if found is not None and found.cut == cut:
            return found
    return None


@dataclass(frozen=True)
class View:
    """A request's messages as they go upstream: the original, or a checkpoint applied to it."""

    messages: list[Message]
    base: Checkpoint | None

    @classmethod
    def of(cls, original: list[Message], base: Checkpoint | None) -> View:
        return cls(base.apply(original) if base else original, base)

    def original_index(self, index: int) -> int | None:
        """Where view message `index` sits in the original list; None for the summary message."""
        if self.base is None:
            return index
        base = self.base
        if index < base.head_end:
            return index
        if index == base.head_end:
            return None
        if index < base.prefix_len:
            return base.pinned[index - base.head_end - 1]
        return base.cut + index - base.prefix_len


def checkpoint_after(
    view: View,
    result: CompactionResult,
    digests: Sequence[bytes],
    *,
    precomputed: bool = False,
) -> Checkpoint | None:
    """The checkpoint recording `result`, a compaction of `view`; None if it cannot be recorded.

    `digests` are the prefix digests of the original list the view was built from.
    """
    if result.summary_message is None or result.path == "unchanged":
        return None
    cut = view.original_index(result.keep_from)
    if cut is None or cut <= 0 or cut > len(digests):
        return None
    if view.base is not None and result.keep_from < view.base.prefix_len:
        return None
    # Built in C: the view of a long history holds hundreds of thousands of messages.
    by_identity = dict(zip(map(id, view.messages), range(len(view.messages)), strict=True))
    prefix = result.messages[: result.prefix_len]
    positions = [i for i, message in enumerate(prefix) if message is result.summary_message]
    if len(positions) != 1:
        return None
    head_end = positions[0]
    pinned: list[int] = []
    for message in prefix[head_end + 1 :]:
        view_index = by_identity.get(id(message))
        original = view.original_index(view_index) if view_index is not None else None
        if original is None:
            return None
        pinned.append(original)
    return Checkpoint(
        key=digests[cut - 1],
        cut=cut,
        head_end=head_end,
        pinned=tuple(pinned),
        summary_message=result.summary_message,
        compaction_id=result.compaction_id,
        path=result.path,
        parent=view.base.key if view.base is not None else None,
        precomputed=precomputed,
        memory_items=result.memory_items if precomputed else (),
    )


def plan_key(view: View, plan: Plan, digests: Sequence[bytes]) -> bytes | None:
    """The key of the checkpoint carrying out `plan` on `view` would have (`digests`: those of
    the original list); None when it folds nothing new."""
    if plan.keep_from <= plan.head_end or not plan.folded:
        return None
    if view.base is not None and plan.keep_from < view.base.prefix_len:
        return None
    cut = view.original_index(plan.keep_from)
    if cut is None or not 0 < cut <= len(digests):
        return None
    return digests[cut - 1]
