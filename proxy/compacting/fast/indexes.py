"""What the proxy remembers of each long conversation's last request (its body's index), so
that the next request of it costs what is new in it, not its whole history.

Agents resend their whole history each time. For a body at least `min_body_bytes` long, the
proxy keeps its bytes with, per item of its items array (chat's and Anthropic's `messages`,
Responses' `input`): where it sits in the body, the chained prefix digest
(compaction.checkpoints.prefix_digests) and the cumulative token estimate (proxy.compacting.
fast.indexing reads them, off the loop). The next body of the conversation is recognized when it
starts with the same bytes up to the end of the last item (one memcmp): only the items after it
are scanned, parsed, hashed and counted, and the other top-level fields are parsed without the
array. A client that edited or took back some of the last few items (Anthropic's cache_control
marks move to the newest turns) is recognized up to the first edited item, the rest read as
new. Anything else that does not match exactly is simply not recognized, and the request takes
the full path. Conversations are keyed by their first bytes; the few that open alike (one
agent's parallel sessions) are remembered side by side under one key.

Forwarded bodies are spliced (proxy.compacting.fast.parts: kept items as the client's bytes, new
ones serialized), so a prefix stays byte-identical from request to request. Dialect-neutral: it
works on a JSON array of items under one top-level key, counted in the dialect's shape.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import orjson
from cachetools import LRUCache

from compaction import (
    DigestPrefix,
    HeuristicEstimator,
    Inline,
    JsonArray,
    Message,
    Offload,
    Shape,
    prefix_digests,
)
from proxy.compacting.decision.request import Payload
from proxy.compacting.fast.indexing import IndexJob, index_body
from proxy.compacting.fast.parts import Part, other_fields, splice
from proxy.compacting.fast.spans import Items, scan_items

# Conversations remembered under one key: an agent's parallel sessions open with the same
# system prompt, often longer than the 4 KiB the key reads.
_CANDIDATES = 8
# How many of the last items of a known request the next one may have edited and still be
# recognized (from the first edited one on, its items are read as new).
_EDITABLE = 8


@dataclass(frozen=True)
class BodyIndex:
    """One request of a conversation as seen, with `count` items: `tokens[i]` is the estimate
    (calibration 1, in `shape`) of items[:i]; `digests[i]` identifies items[:i + 1] under `seed`;
    `opening` holds the items up to the first user message (what a fingerprint session id is
    made of). It is the request's proxy.compacting.decision.history.History, read without
    parsing it.

    The lists may run past `count`: a continuation appends to them in place (so a request costs
    what it adds, not a copy of the history), and only indices below `count` are this request's.
    """

    body: bytes
    open_at: int
    items: Items
    digests: list[bytes]
    tokens: list[int]
    seed: bytes
    shape: Shape
    opening: list[Message]
    count: int
    fingerprint: tuple[Payload, str] | None = None
    """The opening as its dialect reads it (Dialect.opening: head, tool names, first user
    message) from this body's fields and `opening`, and its fingerprint: unchanged opening, same
    fingerprint, no hashing."""

    @property
    def size(self) -> int:
        return len(self.body)

    def __len__(self) -> int:
        return self.count

    def tokens_to(self, end: int) -> int:
        return self.tokens[end]

    def prefix_digests(self) -> Sequence[bytes]:
        """The prefix digests of this request's items (in place, without a copy)."""
        return DigestPrefix(self.digests, self.count)

    def array(self) -> JsonArray:
        """Its items array, `[` to `]`, in its body."""
        return JsonArray(self.body, self.open_at, self.items.close + 1)

    def splice(self, parts: Sequence[Part]) -> bytes:
        """The body with its items array replaced by `parts`; runs of consecutive original items
        are copied as one slice (separators included)."""
        return splice(self.body, self.open_at, self.items, parts)

    def item(self, index: int) -> Message:
        """Item `index`, parsed from its bytes (for the few a decision must read)."""
        item: Message = orjson.loads(self.body[self.items.starts[index] : self.items.ends[index]])
        return item

    def item_bytes(self, index: int) -> int:
        return self.items.ends[index] - self.items.starts[index]


@dataclass(frozen=True)
class Continuation:
    """A body recognized as the continuation of `index`: `fields` is its payload without the
    items array, `added` its items after the known ones, at `tail` in the body."""

    index: BodyIndex
    body: bytes
    fields: Payload
    added: list[Message]
    tail: Items

    @property
    def fields_unchanged(self) -> bool:
        """Its fields are the known request's: the bytes after its items array are the same
        (those before it always are: recognition compared them)."""
        known = self.index
        after = memoryview(self.body)[self.tail.close + 1 :]
        return after == memoryview(known.body)[known.items.close + 1 :]


class BodyIndexes:
    def __init__(
        self,
        *,
        max_bytes: int,
        min_body_bytes: int,
        max_conversations: int = 256,
        offload: Offload | None = None,
    ) -> None:
        """At most `max_bytes` of bodies and their indexes and `max_conversations` keys (the
        conversations that open alike share one) are remembered, the least recently seen
        forgotten first."""
        self._offload: Offload = offload or Inline()
        self._cache: LRUCache[int, tuple[BodyIndex, ...]] = LRUCache(
            max(1, max_bytes), getsizeof=lambda known: sum(map(_size_of, known))
        )
        self._max_bytes = max_bytes
        self._max_conversations = max(1, max_conversations)
        self._min_body_bytes = min_body_bytes

    def conversation_key(self, scope: str, body: bytes) -> int | None:
        """The cache key of the conversation `body` belongs to (None: too small to remember).
        `scope` carries the credential and explicit session; the first 4 KiB tell apart most
        conversations of one scope (a conversation's bytes only grow at the end), and the few
        that open alike (one agent's parallel sessions) share the key.

        Python's own hash, not a digest: the key never leaves the process, and conversations
        whose keys collide only share the key's few slots (recognition compares the bytes).
        A blake2b of the 4 KiB cost 5 µs of every long request; this costs 1."""
        if len(body) < self._min_body_bytes or self._max_bytes <= 0:
            return None
        return hash((scope, body[:4096]))

    def recognize(self, key: int, body: bytes, items_key: str) -> Continuation | None:
        """`body` as the continuation of the last known request of one of the conversations
        under `key`, or None (its items array under `items_key`)."""
        for known in self._cache.get(key, ()):
            seen = _continuation(known, body, items_key)
            if seen is not None:
                return seen
        return None

    def extend(
        self,
        key: int,
        seen: Continuation,
        fingerprint: tuple[Payload, str] | None = None,
        opening: list[Message] | None = None,
    ) -> BodyIndex:
        """Remember the recognized body: only its added items are hashed and counted;
        `fingerprint` replaces the known one (the opening changed), `opening` the known opening
        (its first user message came with the added items)."""
        known, tail, count = seen.index, seen.tail, seen.index.count
        last = known.digests[count - 1] if count else known.seed
        count_message = HeuristicEstimator(shape=known.shape).count_message
        counts = itertools.accumulate(
            (count_message(m) for m in seen.added), initial=known.tokens[count]
        )
        starts, ends, digests, tokens = (
            known.items.starts,
            known.items.ends,
            known.digests,
            known.tokens,
        )
        if len(digests) != count:  # another continuation appended already: branch off
            starts, ends, digests, tokens = (
                starts[:count],
                ends[:count],
                digests[:count],
                tokens[: count + 1],
            )
        starts += tail.starts
        ends += tail.ends
        digests += prefix_digests(seen.added, last)
        tokens += list(counts)[1:]
        extended = BodyIndex(
            body=seen.body,
            open_at=known.open_at,
            items=Items(starts, ends, tail.close),
            digests=digests,
            tokens=tokens,
            seed=known.seed,
            shape=known.shape,
            opening=opening if opening is not None else known.opening,
            count=count + len(seen.added),
            fingerprint=fingerprint or known.fingerprint,
        )
        self._put(key, extended)
        return extended

    async def learn(
        self,
        key: int,
        body: bytes,
        count: int,
        *,
        items_key: str,
        shape: Shape,
        seed: bytes,
        opening: list[Message],
        fingerprint: tuple[Payload, str] | None = None,
    ) -> BodyIndex | None:
        """Remember a body the caller parsed (`count` items under `items_key`, counted in
        `shape`); None if its bytes cannot be followed (then it is not remembered). The scan,
        the digests and the counts run through the offload: their cost grows with the body."""
        job = IndexJob(body, orjson.dumps(items_key), seed, shape)
        found = await self._offload.run(index_body, job)
        if found is None or len(found.digests) != count:
            return None
        known = BodyIndex(
            body=body,
            open_at=found.open_at,
            items=found.items,
            digests=found.digests,
            tokens=found.tokens,
            seed=seed,
            shape=shape,
            opening=opening,
            count=count,
            fingerprint=fingerprint,
        )
        self._put(key, known)
        return known

    def _put(self, key: int, known: BodyIndex) -> None:
        """`known` first under `key`, in place of its conversation's (same seed) last request;
        the others stay while they fit (LRUCache refuses an entry beyond its size)."""
        kept, size = [known], _size_of(known)
        for other in self._cache.get(key, ()):
            if other.seed == known.seed or len(kept) == _CANDIDATES:
                continue
            if size + _size_of(other) <= self._max_bytes:
                kept.append(other)
                size += _size_of(other)
        if size <= self._max_bytes:
            self._cache[key] = tuple(kept)
            while len(self._cache) > self._max_conversations:
                self._cache.popitem()  # the least recently seen
        else:
            self._cache.pop(key, None)


def _continuation(remembered: BodyIndex, body: bytes, items_key: str) -> Continuation | None:
    """`body` as the continuation of `remembered`, or None."""
    close = remembered.items.close
    known: BodyIndex | None = remembered
    if len(body) <= close or not body.startswith(memoryview(remembered.body)[:close]):
        known = _edited_near_the_end(remembered, body)
    if known is None:
        return None
    first = known.items.ends[known.count - 1] if known.count else None
    tail = scan_items(body, known.open_at, first=first)
    if tail is None:
        return None
    # A second `items_key` after the array would be the one a parser keeps: not followed.
    fields = other_fields(body, known.open_at, tail.close, items_key)
    if fields is None:
        return None
    try:
        added = [orjson.loads(body[s:e]) for s, e in zip(tail.starts, tail.ends, strict=True)]
    except orjson.JSONDecodeError:
        return None
    return Continuation(known, body, fields, added, tail)


def _edited_near_the_end(known: BodyIndex, body: bytes) -> BodyIndex | None:
    """`known` cut to the items `body` starts with, when the first that differs (or is missing)
    is one of the last `_EDITABLE` (after the opening); None otherwise. Clients edit their last
    turns (an Anthropic client moves its cache_control marks to the newest user turns every
    request) or take them back (an agent retrying a step)."""
    ends = known.items.ends
    same = max(len(known.opening), known.count - _EDITABLE)
    if same >= known.count:
        return None
    old = memoryview(known.body)
    # One memcmp for the items before the editable ones, then one per editable item (with the
    # separator before it): the first that differs is where the known items end.
    if not same or not body.startswith(old[: ends[same - 1]]):
        return None
    while same < known.count:
        begin = ends[same - 1]
        if not body.startswith(old[begin : ends[same]], begin):
            break
        same += 1
    # Its lists run past `same`: `extend` branches off a copy of what is below it.
    return replace(known, count=same)


def _size_of(known: BodyIndex) -> int:
    # The body dominates; the per-item lists cost about 100 bytes an item.
    return known.size + 100 * known.count
