"""Where the library's CPU work runs, and how a compaction's messages travel there.

A compaction's CPU work (reading the folded messages, the transcript, the ledger, composing and
verifying the summary, checking the result) grows with the history. An in-process agent runs it
inline; a server that must keep answering other requests meanwhile passes an `Offload` that runs
it elsewhere (the proxy: a process pool). Every job is a module-level function of one picklable
argument, returning a picklable value.

A job sent to another process takes the messages as JSON bytes (`JobMessages`): a megabyte of
JSON pickles as one buffer, where the same messages as objects cost a pickle memo entry each,
both ways. A compaction serializes its history once, for all of its jobs (on the proxy's event loop
that serialization costs ~5 ms at 2.7 MiB, 60–70 ms at 50 MiB); a caller that has the messages as
JSON already (the proxy: its client's bytes) gives them, and the history is not serialized at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import orjson

from compaction.types import Message

Job = TypeVar("Job")
Result = TypeVar("Result")


class OffloadLost(Exception):
    """Raised by an `Offload` that lost a job with the process running it, once it reported the
    loss itself: `Compaction.run` lets it through rather than log it again as a failed
    compaction (nothing was wrong with the compaction, only with where it ran)."""


class Offload(Protocol):
    """Runs a job's function somewhere, and says whether that is another process."""

    @property
    def crossing(self) -> bool:
        """True when jobs go to another process: they then carry the messages as JSON, and
        none of the compactor's in-process caches. False: jobs run in the caller's process and
        carry the messages as they are."""
        ...

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        """`fn(job)`, wherever this offload runs CPU work; `OffloadLost` if it lost the job."""
        ...


class Inline:
    """Runs each job at once, in the caller's thread (the default)."""

    crossing = False

    async def run(self, fn: Callable[[Job], Result], job: Job) -> Result:
        return fn(job)


@dataclass(frozen=True)
class JsonArray:
    """A JSON array as its holder has it: `data[start:end]`. `data` may be a larger document
    (the request body the proxy read): sent to a job as it is, never copied out on the caller's
    thread (a fresh copy of 50 MiB costs the event loop about 60 ms, page faults included)."""

    data: bytes
    start: int = 0
    end: int | None = None

    def load(self) -> list[Message]:
        loaded: list[Message] = orjson.loads(memoryview(self.data)[self.start : self.end])
        return loaded


@dataclass(frozen=True)
class JobMessages:
    """A compaction's messages on their way to its jobs: as JSON when they cross to another
    process, else the list itself."""

    json: JsonArray | None
    objects: list[Message] | None

    @classmethod
    def of(
        cls, messages: Sequence[Message], *, crossing: bool, json: JsonArray | None = None
    ) -> JobMessages:
        """`messages` made ready for a job; `json`, their JSON array if the caller has it."""
        if crossing:
            if json is not None:
                return cls(json, None)
            try:
                return cls(JsonArray(orjson.dumps(list(messages))), None)
            except (TypeError, orjson.JSONEncodeError):
                pass  # not plain JSON (an in-process caller's objects): pickled as they are
        return cls(None, list(messages))

    def load(self) -> list[Message]:
        if self.json is not None:
            return self.json.load()
        return self.objects if self.objects is not None else []
