"""What a request that stopped waiting for its summary goes out with.

The summary built by code, when it is ready within a few seconds; else the folded part dropped
with a one-line note after the user's standing instructions (those with no room there are
written to the memory file here: the dropped result is neither stored nor run again). For a history of tens of megabytes the code-built summary costs as much CPU
as the summarization it replaces (and queues behind it in the workers), so without the bound a
request would wait `summary_timeout_s` and then that much again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from compaction import Compaction, CompactionResult
from proxy.compacting.background.workers import WorkerLost

GRACE_S = 5.0
"""How long a request that stopped waiting for a summary waits for the one built by code."""


async def fallback(
    built_by_code: Awaitable[CompactionResult],
    compaction: Compaction,
    timeout_s: float = GRACE_S,
    *,
    session_id: str | None = None,
) -> CompactionResult:
    """`built_by_code` (`compaction` run without the model) if it is ready within `timeout_s`
    (at most GRACE_S: what is left of the request's), else its folded part dropped."""
    try:
        return await asyncio.wait_for(built_by_code, min(timeout_s, GRACE_S))
    except (TimeoutError, WorkerLost):  # a worker lost is logged where it was found
        # In a thread: its cost grows with the folded user turns (their standing instructions
        # are carried; ~0.2 s for 9,500 folded messages), which must not stall the loop.
        dropped = await asyncio.to_thread(compaction.dropped)
        # A failed write is logged by the writer and costs the request nothing.
        await compaction.compactor.flush_memory(
            session_id, dropped.compaction_id, dropped.memory_items
        )
        return dropped
