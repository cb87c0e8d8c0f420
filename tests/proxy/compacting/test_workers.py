"""The worker processes a compaction's CPU work runs in."""

from __future__ import annotations

import os
from concurrent.futures.process import BrokenProcessPool

import pytest

from proxy.compacting.workers import Workers


def pid_of(_: None) -> int:
    return os.getpid()


def die(_: None) -> None:
    os._exit(3)


async def test_jobs_run_in_another_process() -> None:
    workers = Workers(1)
    workers.open()
    try:
        assert await workers.run(pid_of, None) != os.getpid()
    finally:
        await workers.close()


async def test_without_workers_jobs_run_inline() -> None:
    workers = Workers(0)
    workers.open()
    assert await workers.run(pid_of, None) == os.getpid()
    await workers.close()


async def test_a_pool_broken_by_a_dying_worker_is_replaced() -> None:
    workers = Workers(1)
    workers.open()
    try:
        with pytest.raises(BrokenProcessPool):
            await workers.run(die, None)
        assert await workers.run(pid_of, None) != os.getpid()
    finally:
        await workers.close()
