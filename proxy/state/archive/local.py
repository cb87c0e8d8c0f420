"""The archive in the process only (`state.backend: memory`): lost at restart, like the rest of
that backend's state. Searched by the simple term score."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence

from proxy.state.archive.entries import Entry, Found, Scope, find_in_two_trips, text_bytes
from proxy.state.archive.terms import query_terms, score_text

# The entry, its two strings and its place in the scope's dict, beside what they hold.
_ENTRY_BYTES = 300


class LocalArchive:
    name = "memory"

    def __init__(
        self,
        *,
        max_bytes: int,
        max_age_s: float,
        max_total_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """At most `max_bytes` per session and credential, `max_total_bytes` over all of them
        (None: no bound but the age): beyond it the least recently archived scope goes whole
        (the one just archived, when it is the only one: its oldest turns)."""
        self._max_bytes = max_bytes
        self._max_total_bytes = max_total_bytes
        self._max_age_s = max_age_s
        self._clock = clock
        # Least recently archived first (a scope archived again moves to the end).
        self._scopes: dict[Scope, dict[int, Entry]] = {}
        self._sizes: dict[Scope, int] = {}
        self._total = 0

    def weight(self, entry: Entry) -> int:
        """Its packed JSON and its text as the process holds them, and the objects around."""
        return entry.size + text_bytes(entry.text) + _ENTRY_BYTES

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def add(self, scope: Scope, entries: Sequence[Entry]) -> dict[str, int]:
        kept = self._scopes.pop(scope, {})
        self._scopes[scope] = kept
        size = self._sizes.get(scope, 0)
        for entry in entries:
            if entry.index not in kept:
                kept[entry.index] = entry
                size += self.weight(entry)
                self._total += self.weight(entry)
        self._sizes[scope] = size
        if not kept:  # nothing archived: no scope kept empty
            del self._scopes[scope], self._sizes[scope]
            return {"age": 0, "size": 0, "total": 0}
        dropped = self._bound(scope)
        # A session archived no more ages out too: the least recently archived is looked at
        # each time, so idle ones go one by one.
        oldest = next(iter(self._scopes), scope)
        if oldest != scope:
            dropped["age"] += self._bound(oldest)["age"]
        dropped["total"] = self._bound_total(scope)
        return dropped

    def _bound(self, scope: Scope) -> dict[str, int]:
        """Drop what is too old, then the oldest beyond the size (dicts keep insertion order:
        the oldest archived come first)."""
        kept = self._scopes[scope]
        horizon = self._clock() - self._max_age_s
        dropped = {"age": 0, "size": 0}
        for index in [i for i, entry in kept.items() if entry.at < horizon]:
            self._drop(scope, index)
            dropped["age"] += 1
        while self._sizes.get(scope, 0) > self._max_bytes and scope in self._scopes:
            self._drop(scope, next(iter(kept)))
            dropped["size"] += 1
        return dropped

    def _bound_total(self, current: Scope) -> int:
        """Beyond the total size: the least recently archived scopes whole, then the oldest
        turns of `current` (the most recent)."""
        dropped = 0
        while self._max_total_bytes is not None and self._total > self._max_total_bytes:
            oldest = next(iter(self._scopes))
            if oldest != current:
                dropped += len(self._scopes[oldest])
                self._total -= self._sizes.pop(oldest)
                del self._scopes[oldest]
                continue
            self._drop(oldest, next(iter(self._scopes[oldest])))
            dropped += 1
        return dropped

    def _drop(self, scope: Scope, index: int) -> None:
        kept = self._scopes[scope]
        size = self.weight(kept.pop(index))
        self._sizes[scope] -= size
        self._total -= size
        if not kept:
            del self._scopes[scope], self._sizes[scope]

    def _entries(self, session: str, tenant: str | None) -> list[Entry]:
        return [
            entry
            for scope, kept in self._scopes.items()
            if scope.session == session and (tenant is None or scope.tenant == tenant)
            for entry in kept.values()
        ]

    async def search(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> list[Found]:
        terms = query_terms(query)
        scored = (
            (score_text(entry.text, terms), entry) for entry in self._entries(session, tenant)
        )
        best = heapq.nlargest(
            limit, ((s, -e.index, e) for s, e in scored if s > 0), key=lambda t: t[:2]
        )
        return [entry.found(score) for score, _, entry in best]

    async def find(
        self, session: str, query: str, *, tenant: str | None, limit: int
    ) -> tuple[list[Found], set[str] | None]:
        return await find_in_two_trips(self, session, query, tenant=tenant, limit=limit)

    async def compactions(self, session: str, *, tenant: str | None) -> set[str]:
        return {entry.compaction_id for entry in self._entries(session, tenant)}
