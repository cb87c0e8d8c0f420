"""What the proxy remembers of each long conversation's last request, so that the next request
of it costs what is new in it, not its whole history.

Agents resend their whole history each time. For a body at least `min_body_bytes` long, the
proxy keeps its bytes with, per item of its items array (chat's and Anthropic's `messages`,
Responses' `input`): where it sits in the
body, the chained prefix digest (compaction.checkpoints.prefix_digests) and the cumulative token
estimate. The next body of the conversation is recognized when it starts with the same bytes up
to the end of the last item (one memcmp): only the items after it are scanned, parsed, hashed and
counted, and the other top-level fields are parsed without the array. Anything that does not
match exactly is simply not recognized, and the request takes the full path.

Forwarded bodies are spliced (proxy.compacting.parts: kept items as the client's bytes, new
ones serialized), so a prefix stays byte-identical from request to request. Dialect-neutral: it
works on a JSON array of items under one top-level key, counted in the dialect's shape.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from compaction import HeuristicEstimator
from compaction.checkpoints import prefix_digests
from compaction.messages import Shape
from compaction.offload import Inline, Offload
from proxy.compacting.parts import Part, is_same, splice
from proxy.compacting.spans import Items, locate_value, scan_items


@dataclass(frozen=True)
class Known:
    """One request of a conversation as seen, with `count` items: `tokens[i]` is the estimate
    (calibration 1, in `shape`) of items[:i]; `digests[i]` identifies items[:i + 1] under `seed`;
    `opening` holds the items up to the first user message (what a fingerprint session id is
    made of).

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
    opening: list[Any]
    count: int
    fingerprint: tuple[Any, str] | None = None
    """The opening as its dialect reads it (Dialect.opening: head, tool names, first user
    message) and its fingerprint: unchanged opening, same fingerprint, no hashing."""

    @property
    def size(self) -> int:
        return len(self.body)

    def request_digests(self) -> list[bytes]:
        """The prefix digests of this request's items (a copy)."""
        return self.digests[: self.count]

    def splice(self, parts: Sequence[Part]) -> bytes:
        """The body with its items array replaced by `parts`; runs of consecutive original items
        are copied as one slice (separators included)."""
        return splice(self.body, self.open_at, self.items, parts)

    def item(self, index: int) -> Any:
        """Item `index`, parsed from its bytes (for the few a decision must read)."""
        return orjson.loads(self.body[self.items.starts[index] : self.items.ends[index]])


@dataclass(frozen=True)
class Recognized:
    """A body recognized as the continuation of `known`: `fields` is its payload without the
    items array, `added` its items after the known ones, at `tail` in the body."""

    known: Known
    body: bytes
    fields: dict[str, Any]
    added: list[Any]
    tail: Items


class KnownRequests:
    def __init__(
        self,
        *,
        max_bytes: int,
        min_body_bytes: int,
        offload: Offload | None = None,
    ) -> None:
        self._offload: Offload = offload or Inline()
        self._cache: LRUCache[bytes, Known] = LRUCache(max(1, max_bytes), getsizeof=_size_of)
        self._max_bytes = max_bytes
        self._min_body_bytes = min_body_bytes

    def conversation_key(self, scope: str, body: bytes) -> bytes | None:
        """The cache key of the conversation `body` belongs to (None: too small to remember).
        `scope` carries the credential and explicit session; the first 4 KiB tell apart the
        conversations of one scope (a conversation's bytes only grow at the end)."""
        if len(body) < self._min_body_bytes or self._max_bytes <= 0:
            return None
        return hashlib.blake2b(scope.encode() + b"\x00" + body[:4096], digest_size=16).digest()

    def recognize(self, key: bytes, body: bytes, items_key: str) -> Recognized | None:
        """`body` as the continuation of the conversation's last known request, or None (its
        items array under `items_key`)."""
        known = self._cache.get(key)
        if known is None:
            return None
        items = known.items
        if len(body) <= items.close or not body.startswith(memoryview(known.body)[: items.close]):
            return None
        first = items.ends[known.count - 1] if known.count else None
        tail = scan_items(body, known.open_at, first=first)
        if tail is None:
            return None
        try:
            fields = orjson.loads(body[: known.open_at] + b"[]" + body[tail.close + 1 :])
            added = [orjson.loads(body[s:e]) for s, e in zip(tail.starts, tail.ends, strict=True)]
        except orjson.JSONDecodeError:
            return None
        # A second `items_key` after the array would be the one a parser keeps: not followed.
        if not isinstance(fields, dict) or fields.get(items_key) != []:
            return None
        return Recognized(known, body, fields, added, tail)

    def extend(
        self, key: bytes, seen: Recognized, fingerprint: tuple[Any, str] | None = None
    ) -> Known:
        """Remember the recognized body: only its added items are hashed and counted;
        `fingerprint` replaces the known one (the opening changed outside the list)."""
        known, tail, count = seen.known, seen.tail, seen.known.count
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
        extended = Known(
            body=seen.body,
            open_at=known.open_at,
            items=Items(starts, ends, tail.close),
            digests=digests,
            tokens=tokens,
            seed=known.seed,
            shape=known.shape,
            opening=known.opening,
            count=count + len(seen.added),
            fingerprint=fingerprint or known.fingerprint,
        )
        self._put(key, extended)
        return extended

    async def learn(
        self,
        key: bytes,
        body: bytes,
        count: int,
        *,
        items_key: str,
        shape: Shape,
        seed: bytes,
        opening: list[Any],
        fingerprint: tuple[Any, str] | None = None,
    ) -> Known | None:
        """Remember a body the caller parsed (`count` items under `items_key`, counted in
        `shape`); None if its bytes cannot be followed (then it is not remembered). The scan,
        the digests and the counts run through the offload: their cost grows with the body."""
        job = LearnJob(body, orjson.dumps(items_key), seed, shape)
        found = await self._offload.run(learn_body, job)
        if found is None or len(found.digests) != count:
            return None
        known = Known(
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

    def _put(self, key: bytes, known: Known) -> None:
        if _size_of(known) <= self._max_bytes:  # LRUCache refuses an entry beyond its size
            self._cache[key] = known
        else:
            self._cache.pop(key, None)


@dataclass(frozen=True)
class LearnJob:
    body: bytes
    key: bytes
    seed: bytes
    shape: Shape


@dataclass(frozen=True)
class Learned:
    open_at: int
    items: Items
    digests: list[bytes]
    tokens: list[int]


def learn_body(job: LearnJob) -> Learned | None:
    """Where the items of `job.body` are, their prefix digests and cumulative counts; None when
    the bytes cannot be followed. A job for an Offload (another process may run it)."""
    body = job.body
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    messages = payload.get(orjson.loads(job.key)) if isinstance(payload, dict) else None
    open_at = locate_value(body, job.key)
    items = scan_items(body, open_at) if open_at is not None else None
    if not isinstance(messages, list) or open_at is None or items is None:
        return None
    if len(items.starts) != len(messages) or (messages and not is_same(body, items, messages)):
        return None
    count = HeuristicEstimator(shape=job.shape).count_message
    return Learned(
        open_at=open_at,
        items=items,
        digests=prefix_digests(messages, job.seed),
        tokens=list(itertools.accumulate((count(m) for m in messages), initial=0)),
    )


def _size_of(known: Known) -> int:
    # The body dominates; the per-item lists cost about 100 bytes an item.
    return known.size + 100 * known.count
