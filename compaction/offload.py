"""Where the library's CPU work runs.

A compaction's CPU work (reading the folded messages, the transcript, the ledger, composing and
verifying the summary, checking the result) grows with the history. An in-process agent runs it
inline; a server that must keep answering other requests meanwhile passes an `Offload` that runs
it elsewhere (the proxy: a process pool). Every job is a module-level function of one picklable
argument, returning a picklable value.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


class Offload(Protocol):
    """Runs a job's function somewhere. One whose jobs stay in the caller's process says so with
    `crossing = False` (its jobs then carry the messages as they are, and the compactor's
    caches); any other is taken to send them to another process, packed."""

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        """`fn(job)`, wherever this offload runs CPU work."""
        ...


class Inline:
    """Runs each job at once, in the caller's thread (the default)."""

    crossing = False

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        return fn(job)


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the duration (restored as it was).

    A fold builds an object or two per message (Items, Blocks, entries) that all live until it
    ends: the collector's passes triggered by those allocations (~190 for a 12k-message fold,
    one of them over the whole heap) find nothing to free and cost about a tenth of the fold.
    Cycles made meanwhile are collected by the next pass after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
