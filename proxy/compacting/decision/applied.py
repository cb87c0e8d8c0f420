"""Which compactions some request has already gone out with.

A checkpoint substituted for the first time (one prepared in the background, or finished after
its request left on the fallback) is new to the conversation: that request is reported "applied";
later ones "reused". BodyIndex in the process (a bounded table) and in the state backend, so a
restarted proxy or another replica reports a compaction already sent as "reused".
"""

from __future__ import annotations

from cachetools import LRUCache

from proxy.state.roles import ForwardedMarks


class AppliedCompactions:
    def __init__(self, marks: ForwardedMarks, max_entries: int) -> None:
        self._marks = marks
        self._known: LRUCache[str, None] = LRUCache(max_entries)

    async def add(self, compaction_id: str) -> bool:
        """Record that a request goes out with this compaction: True the first time anywhere
        (in this process, an earlier one, or a replica); from then on it is known."""
        if compaction_id in self._known:
            return False
        # Known before the await, so concurrent requests of this process see it; across
        # processes the backend's mark is atomic and only one of them gets True.
        self._known[compaction_id] = None
        return await self._marks.mark_forwarded(compaction_id)

    async def is_new(self, compaction_id: str) -> bool:
        """True for the one request that goes out first with this compaction."""
        return await self.add(compaction_id)
