"""Where the library's CPU work runs.

A compaction's CPU work (reading the folded messages, the transcript, the ledger, composing and
verifying the summary, checking the result) grows with the history. An in-process agent runs it
inline; a server that must keep answering other requests meanwhile passes an `Offload` that runs
it elsewhere (the proxy: a process pool). Every job is a module-level function of one picklable
argument, returning a picklable value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


class Offload(Protocol):
    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        """`fn(job)`, wherever this offload runs CPU work."""
        ...


class Inline:
    """Runs each job at once, in the caller's thread (the default)."""

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        return fn(job)
