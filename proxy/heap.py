"""The process's freed memory given back to the system, now and then (`server.heap_trim_s`).

glibc's malloc keeps what the process frees: in one arena per thread that allocates (the event
loop, the state file's writer, the worker pool's result reader, the threads of `to_thread`), it
returns to the system only the top of each heap, and only past a threshold that rises with the
largest block freed (request bodies of hundreds of KB). Under a steady load the free space inside
the arenas grows fragmented and RSS keeps rising long after the live objects stopped growing:
in `bench.soak` with every cache full, 390 KB/s over the last third without trimming, 46 KB/s
with it (docs/performance.md). `malloc_trim(0)` hands every whole free page of every arena back
(madvise); it runs in a thread, so the event loop never waits for all of it. Where the C library
has no `malloc_trim` (musl, macOS) there is nothing to do.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Trim = Callable[[], object]


def find_trim() -> Trim | None:
    """glibc's `malloc_trim(0)` as a call, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


async def trim_heap_every(interval_s: float, trim: Trim) -> None:
    """Call `trim` in a thread every `interval_s` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(trim)
        except Exception as exc:  # never fatal: memory only stays with the process
            log.debug("heap trim failed: %r", exc)
