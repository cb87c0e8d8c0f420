"""Checkpoints: remembering a compaction so the same history is never summarized twice.

Agents resend their whole history on every call. A checkpoint records how the prefix
`messages[:cut]` of one conversation was compacted, under a digest of exactly that prefix (chained
from a seed that carries the caller's credential and session, so tenants never share). The next
request of the conversation finds its longest remembered prefix, substitutes the same summary
message (byte-stable, so upstream prompt caches keep hitting) and, only if still too large, extends
it: the summary then sits inside the folded span and the library writes an updated summary.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol, overload

import orjson
from cachetools import TTLCache

from compaction.messages import Shape
from compaction.tokens import HeuristicEstimator
from compaction.types import CompactionResult, MemoryItem, Message, Plan, Preview, as_memory_type

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


Part = int | range | Message
"""A piece of a view: one original message by index (a pinned one), a run of them, or a message
of the checkpoint's own (its summary, a preview)."""


@dataclass(frozen=True)
class Layout:
    """How a checkpoint's view is made of the original list: `messages[:cut]` becomes `parts`, in
    order, and `messages[cut:]` follows as sent. The one description of a view that everything
    reading one follows: applying it (Checkpoint.apply), estimating it and splicing its bytes (the
    proxy's history and fast path), saying what it folded (the proxy's records)."""

    parts: tuple[Part, ...]
    head_end: int
    """Where what the checkpoint replaces starts: messages before it are the head, kept."""
    cut: int
    reduced: tuple[int, ...] = ()
    """The original messages that stand in the view as their previews, in order."""

    def parts_of(self, count: int) -> list[Part]:
        """The view of a list of `count` messages (at least `cut`): the parts, then the rest."""
        return [*self.parts, range(self.cut, count)]

    @functools.cached_property
    def kept(self) -> tuple[range, ...]:
        """The original messages the view carries before the cut, as runs (a pinned one: a run
        of one); everything else before the cut is folded or reduced."""
        runs: list[range] = []
        for part in self.parts:
            if isinstance(part, int):
                runs.append(range(part, part + 1))
            elif isinstance(part, range) and part:
                runs.append(part)
        return tuple(runs)

    def apply(self, messages: Sequence[Message]) -> list[Message]:
        view: list[Message] = []
        for part in self.parts_of(len(messages)):
            if isinstance(part, range):
                view += messages[part.start : part.stop]
            elif isinstance(part, int):
                view.append(messages[part])
            else:
                view.append(part)
        return view

    def folded_since(self, base: Layout | None) -> range:
        """The original messages this layout folds (or reduces to previews) that the view of
        `base` (None: the original list) still carried: from the base's cut (or the head's
        end), or from an earlier message reduced to its preview now, to the cut."""
        start = base.cut if base is not None else self.head_end
        if self.reduced:
            before = set(base.reduced) if base is not None else set()
            start = min([start, *(i for i in self.reduced if i not in before)])
        return range(start, self.cut)


@dataclass(frozen=True)
class Checkpoint:
    """`messages[:cut]` of a conversation becomes head + summary + pinned messages + run.

    Only the summary message and the previews are stored; head, pinned and run messages are
    taken from each request (their content is the same by the digest), so the agent's own bytes
    go upstream. The run is `messages[resume:cut]` with each preview (compaction.selective) in
    its message's place: empty for a summary alone (`resume` None: the cut), the whole
    reduced span for previews alone (no summary, nothing pinned, `head_end == resume`).
    """

    key: bytes
    cut: int
    head_end: int
    pinned: tuple[int, ...]
    summary_message: Message | None
    compaction_id: str
    path: str
    parent: bytes | None = None
    """Key of the checkpoint this one extended (None: it compacted the original history)."""
    precomputed: bool = False
    """Prepared ahead of the trigger: held in reserve until the parent's view reaches it."""
    memory_items: tuple[MemoryItem, ...] = ()
    """A reserve's memory items, written to the memory file when it is applied, not before (a
    conversation that never reaches the trigger must not leave memory behind)."""
    previews: tuple[Preview, ...] = ()
    """Messages of the run replaced by their previews, by index in the original list, in order."""
    resume: int | None = None
    """Where the run starts in the original list (None: at the cut, no run)."""

    @property
    def run_start(self) -> int:
        return self.cut if self.resume is None else self.resume

    @property
    def run_offset(self) -> int:
        """Where the run starts in the view: after the head, the summary and the pinned."""
        return self.head_end + (self.summary_message is not None) + len(self.pinned)

    @functools.cached_property
    def layout(self) -> Layout:
        """Where each message of its view comes from (Layout), worked out once per object."""
        parts: list[int | range | Message] = [range(self.head_end)]
        if self.summary_message is not None:
            parts.append(self.summary_message)
        parts += self.pinned
        start = self.run_start
        for index, preview in self.previews:
            parts += [range(start, index), preview]
            start = index + 1
        parts.append(range(start, self.cut))
        return Layout(
            tuple(parts), self.head_end, self.cut, tuple(index for index, _ in self.previews)
        )

    def apply(self, messages: Sequence[Message]) -> list[Message]:
        """The compacted view of a request whose first `cut` messages match this checkpoint."""
        return self.layout.apply(messages)

    @property
    def prefix_len(self) -> int:
        """Length of what replaces messages[:cut] in the view."""
        return self.run_offset + self.cut - self.run_start

    def position(self, index: int) -> int | None:
        """The original index view message `index` stands for (a preview: the message it
        reduces); None for the summary message."""
        if index < self.head_end:
            return index
        offset = self.run_offset
        if index < offset:
            pinned = index - self.head_end - (self.summary_message is not None)
            return None if pinned < 0 else self.pinned[pinned]
        return self.run_start + index - offset

    def preview_tokens(self, shape: Shape) -> int:
        """What its previews cost at calibration 1 in `shape`: the estimate of a view reads it
        on every request, so it is counted once per checkpoint object and shape (kept in the
        instance's dict, outside the fields that compare and serialize)."""
        counted: dict[int, int] = self.__dict__.setdefault("_preview_tokens", {})
        found = counted.get(id(shape))
        if found is None:
            estimator = HeuristicEstimator(shape=shape)
            found = sum(estimator.count_message(message) for _, message in self.previews)
            counted[id(shape)] = found
        return found

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (digests in hex) that `from_json` reads back, tagged with a version
        (a checkpoint with previews is of the later one: an older reader misses it)."""
        data: dict[str, Any] = {
            "version": CHECKPOINT_VERSION if not self.previews else PREVIEWS_VERSION,
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
        if self.previews:
            data["previews"] = [[i, message] for i, message in self.previews]
            data["resume"] = self.run_start
        return data

    @classmethod
    def from_json(cls, data: object) -> Checkpoint:
        """The checkpoint `to_json` wrote; ValueError for another version or malformed data (a
        store treats that as a miss)."""
        if not isinstance(data, dict) or data.get("version") not in (
            CHECKPOINT_VERSION,
            PREVIEWS_VERSION,
        ):
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
                previews=tuple((_non_negative(i), m) for i, m in data.get("previews", [])),
                resume=_non_negative(data["resume"]) if "resume" in data else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed checkpoint: {exc}") from exc
        if checkpoint.cut <= 0 or not _is_replacement(checkpoint):
            raise ValueError("malformed checkpoint: no summary message or preview, or none fits")
        if (data["version"] == PREVIEWS_VERSION) != bool(checkpoint.previews):
            raise ValueError("malformed checkpoint: previews under the wrong version")
        return checkpoint


def _is_replacement(checkpoint: Checkpoint) -> bool:
    """A summary message, or previews (dicts, in order, inside the run), or both."""
    summary = checkpoint.summary_message
    if summary is None and not checkpoint.previews:
        return False
    if summary is not None and not isinstance(summary, dict):
        return False
    indices = [i for i, _ in checkpoint.previews]
    return all(isinstance(m, dict) for _, m in checkpoint.previews) and (
        indices == sorted(set(indices))
        and all(checkpoint.run_start <= i < checkpoint.cut for i in indices)
    )


CHECKPOINT_VERSION = 1
PREVIEWS_VERSION = 2
"""A checkpoint with previews (`Checkpoint.previews`); one without keeps version 1."""


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
    async `CheckpointStore` over it is proxy.state.local."""

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
        """Where view message `index` sits in the original list; None for a message that is
        not the original's (the summary, a preview)."""
        if self.base is None:
            return index
        found = self.base.position(index)
        if found is None or (self.base.previews and found in dict(self.base.previews)):
            return None
        return found

    def position(self, index: int) -> int | None:
        """The original index view message `index` stands for (a preview: the message it
        reduces); None for the summary message."""
        return index if self.base is None else self.base.position(index)


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
    if result.path == "unchanged":
        return None
    if result.previews:
        return _previewed(view, result, digests, precomputed=precomputed)
    if result.summary_message is None:
        return None
    keep = _kept_from(view, result.keep_from, digests)
    if keep is None:
        return None
    cut, carried = keep
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
        previews=carried,
        resume=view.position(result.keep_from) if carried else None,
    )


def _kept_from(
    view: View, keep_from: int, digests: Sequence[bytes]
) -> tuple[int, tuple[Preview, ...]] | None:
    """The cut of a summary that keeps `view[keep_from:]`, and the base's previews it keeps
    (they stay in place: the cut then reaches past them); None when it cannot be recorded."""
    base = view.base
    if base is not None and keep_from < base.run_offset:
        return None
    kept = view.position(keep_from)
    if kept is None or kept <= 0 or kept > len(digests):
        return None
    carried = tuple(p for p in base.previews if p[0] >= kept) if base is not None else ()
    cut = max(base.cut, kept) if base is not None and carried else kept
    return (cut, carried) if cut <= len(digests) else None


def _previewed(
    view: View, result: CompactionResult, digests: Sequence[bytes], *, precomputed: bool
) -> Checkpoint | None:
    """The checkpoint of a selective result: the base's summary and previews, and the new ones."""
    found = _preview_extent(view, [i for i, _ in result.previews], digests)
    if found is None:
        return None
    cut, positions = found
    base = view.base
    previews = dict(base.previews) if base is not None else {}
    previews.update(zip(positions, (m for _, m in result.previews), strict=True))
    if base is not None and base.summary_message is not None:
        head_end, summary, pinned, resume = (
            base.head_end, base.summary_message, base.pinned, base.run_start,
        )  # fmt: skip
    else:
        head_end = resume = min(previews)
        summary, pinned = None, ()
    return Checkpoint(
        key=digests[cut - 1],
        cut=cut,
        head_end=head_end,
        pinned=pinned,
        summary_message=summary,
        compaction_id=result.compaction_id,
        path=result.path,
        parent=base.key if base is not None else None,
        precomputed=precomputed,
        previews=tuple(sorted(previews.items(), key=lambda p: p[0])),
        resume=resume,
    )


def _preview_extent(
    view: View, indices: Sequence[int], digests: Sequence[bytes]
) -> tuple[int, list[int]] | None:
    """The cut of a checkpoint that previews view messages `indices`, and their original
    positions; None when it cannot be recorded (a preview of the base's summary or pinned)."""
    base = view.base
    if not indices:
        return None
    if base is not None and base.summary_message is not None and indices[0] < base.run_offset:
        return None
    positions = [view.position(i) for i in indices]
    known = [p for p in positions if p is not None]
    if len(known) != len(positions):
        return None
    cut = max(base.cut if base is not None else 0, max(known) + 1)
    return (cut, known) if 0 < cut <= len(digests) else None


def plan_key(view: View, plan: Plan, digests: Sequence[bytes]) -> bytes | None:
    """The key of the checkpoint carrying out `plan` on `view` would have (`digests`: those of
    the original list); None when it folds nothing new."""
    if plan.previews:
        found = _preview_extent(view, [i for i, _ in plan.previews], digests)
        return digests[found[0] - 1] if found is not None else None
    if plan.keep_from <= plan.head_end or not plan.folded:
        return None
    keep = _kept_from(view, plan.keep_from, digests)
    return digests[keep[0] - 1] if keep is not None else None
