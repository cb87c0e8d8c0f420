"""Background tasks: tracked while they run, cancelled at shutdown."""

from __future__ import annotations

import asyncio

import pytest

from proxy.tasks import BackgroundTasks


async def test_background_tasks_are_cancelled_at_close() -> None:
    tasks = BackgroundTasks()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    task = tasks.spawn(forever(), name="forever")
    await started.wait()
    assert len(tasks) == 1
    await tasks.close()
    assert task.cancelled()
    assert len(tasks) == 0
    with pytest.raises(RuntimeError):
        tasks.spawn(forever(), name="late")
