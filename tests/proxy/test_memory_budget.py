"""One memory budget: every in-process cache is bounded by a setting (docs/operations.md sums
them up), the bounds the settings name are the ones the running proxy uses, and what the process
frees goes back to the system (proxy.heap)."""

from __future__ import annotations

import asyncio
import contextlib
import platform
import subprocess
import sys
from threading import get_ident

from proxy.compacting.models.calibration import Calibration
from proxy.compacting.models.overflow import LearnedWindows
from proxy.heap import trim_heap_every
from proxy.settings import load_settings


def test_the_new_bounds_have_safe_defaults_and_come_from_the_environment() -> None:
    defaults = load_settings(None, {}, {})
    assert defaults.models.max_models == 1024
    assert defaults.memory.max_sessions == 512
    assert defaults.memory.cached_items == 10000
    assert defaults.compaction.known_requests == 256
    assert defaults.compaction.scanned_chars == 32 * 2**20  # the library's own default
    assert defaults.archive.memory_max_mb == 256
    env = {
        "COMPACTION_PROXY__MODELS__MAX_MODELS": "8",
        "COMPACTION_PROXY__MEMORY__MAX_SESSIONS": "16",
        "COMPACTION_PROXY__MEMORY__CACHED_ITEMS": "32",
        "COMPACTION_PROXY__COMPACTION__KNOWN_REQUESTS": "4",
        "COMPACTION_PROXY__COMPACTION__SCANNED_TEXTS_MB": "1",
        "COMPACTION_PROXY__ARCHIVE__MEMORY_MAX_MB": "2",
    }
    tuned = load_settings(None, env, {})
    assert (tuned.models.max_models, tuned.memory.max_sessions) == (8, 16)
    assert (tuned.memory.cached_items, tuned.compaction.known_requests) == (32, 4)
    assert tuned.compaction.scanned_chars == 2**20 // 3
    assert tuned.archive.memory_max_bytes == 2 * 2**20


def test_calibration_keeps_at_most_max_models() -> None:
    calibration = Calibration(max_models=2)  # create_app passes models.max_models
    for model in ("a", "b", "c"):
        calibration.observe(model, 1000, 1500)
    assert calibration.factor("a") == 1.0  # forgotten: the least recently used
    assert calibration.factor("b") == calibration.factor("c") == 1.5


def test_learned_windows_keep_at_most_max_models() -> None:
    learned = LearnedWindows(max_models=2)  # create_app passes models.max_models
    for model in ("a", "b", "c"):
        learned.learn(model, 8000, 128_000)
    assert learned.window("a", 128_000) == 128_000  # forgotten
    assert learned.window("c", 128_000) == 8000


def test_calibration_alone_keeps_its_default_bound() -> None:
    calibration = Calibration()
    for number in range(1030):
        calibration.observe(f"m{number}", 1000, 1200)
    assert calibration.factor("m0") == 1.0 and calibration.factor("m1029") == 1.2


async def test_the_heap_is_trimmed_every_interval_in_a_thread() -> None:
    threads: list[int] = []
    trimming = asyncio.create_task(trim_heap_every(0.01, lambda: threads.append(get_ident())))
    while len(threads) < 3:
        await asyncio.sleep(0.01)
    trimming.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await trimming
    assert get_ident() not in threads  # the event loop never waits for a whole trim


async def test_a_failed_trim_is_not_fatal() -> None:
    calls: list[int] = []

    def trim() -> None:
        calls.append(1)
        raise OSError("no")

    trimming = asyncio.create_task(trim_heap_every(0.01, trim))
    while len(calls) < 2:
        await asyncio.sleep(0.01)
    assert not trimming.done()
    trimming.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await trimming


_FRAGMENTED = """
from proxy.heap import find_trim

def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) // 1024 for l in status if l.startswith("VmRSS:"))

trim = find_trim()
blocks = [bytes(64 * 1024 - 100) for _ in range(1600)]  # ~100 MB below the mmap threshold
kept = blocks[::16]  # one in 16 stays: the free space between them is not the heap's top
del blocks
before = rss_mb()
trim()
print(before, rss_mb())
"""


def test_a_trim_gives_the_freed_memory_back_to_the_system() -> None:
    assert platform.libc_ver()[0] == "glibc", "the proxy image and CI run on glibc"
    run = subprocess.run(
        [sys.executable, "-c", _FRAGMENTED], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    before, after = map(int, run.stdout.split())
    assert before - after > 50, (before, after)  # ~94 MB freed, of which ~6 MB still in use


def test_the_heap_is_trimmed_every_thirty_seconds_by_default() -> None:
    assert load_settings(None, {}, {}).server.heap_trim_s == 30
