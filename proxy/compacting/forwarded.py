"""Which compactions some request has already gone out with.

A checkpoint substituted for the first time (one prepared in the background, or finished after
its request left on the fallback) is new to the conversation: that request is reported "applied";
later ones "reused". Known in the process (a bounded table) and in the state backend, so a
restarted proxy or another replica reports a compaction already sent as "reused".
"""

from __future__ import annotations

from cachetools import LRUCache

from proxy.compacting.stores.backend import StateBackend


class Forwarded:
    def __init__(self, state: StateBackend, max_entries: int) -> None:
        self._state = state
        self._known: LRUCache[str, None] = LRUCache(max_entries)

    async def add(self, compaction_id: str) -> None:
        if compaction_id not in self._known:
            self._known[compaction_id] = None
            await self._state.mark_forwarded(compaction_id)

    async def is_new(self, compaction_id: str) -> bool:
        """True the first time a compaction goes out anywhere (and from then on it is known)."""
        if compaction_id in self._known:
            return False
        if await self._state.is_forwarded(compaction_id):  # by an earlier process, or a replica
            self._known[compaction_id] = None
            return False
        await self.add(compaction_id)
        return True
