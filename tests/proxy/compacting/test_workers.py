"""The worker processes a compaction's CPU work runs in."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from compaction import Compactor
from compaction.stages import worker_mentions
from proxy.compacting.background.workers import WorkerLost, Workers
from proxy.metrics import Metrics
from tests.compaction.conftest import ScriptedLLM
from tests.factories import simple_conversation
from tests.proxy.compacting.worker_jobs import die, nap, pid_of


def scanned_here(_: None) -> int:
    return worker_mentions().scanned


def scanned_bound_here(_: None) -> int:
    return worker_mentions().max_chars


def replaced(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value(
        "compaction_proxy_worker_replacements_total", {"reason": reason}
    )


def worker_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "proxy.compacting.background.workers"]


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
        with pytest.raises(WorkerLost):
            await workers.run(die, None)
        assert await workers.run(pid_of, None) != os.getpid()
    finally:
        await workers.close()


async def test_a_stopped_worker_is_killed_at_the_deadline_and_the_next_job_runs() -> None:
    metrics = Metrics()
    workers = Workers(1, timeout_s=3, replacements=metrics.compaction.worker_replacements)
    workers.open()
    try:
        stopped = await workers.run(pid_of, None)
        os.kill(stopped, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(WorkerLost):
            await asyncio.wait_for(workers.run(pid_of, None), 15)
        assert 3 <= time.monotonic() - started < 3 + 5
        await wait_until(lambda: not is_alive(stopped))
        assert await asyncio.wait_for(workers.run(pid_of, None), 30) not in (stopped, os.getpid())
        assert replaced(metrics.registry, "deadline") == 1
    finally:
        await workers.close()


async def test_jobs_waiting_their_turn_behind_a_stuck_worker_run_in_the_new_pool() -> None:
    # One job per worker is in the pool at a time: only the stuck one is lost, and the deadline
    # of those behind it runs from their own start, not from when they were queued.
    workers = Workers(1, timeout_s=3)
    workers.open()
    try:
        stopped = await workers.run(pid_of, None)
        os.kill(stopped, signal.SIGSTOP)
        jobs = [asyncio.ensure_future(workers.run(pid_of, None)) for _ in range(3)]
        done = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 60)
        assert isinstance(done[0], WorkerLost)
        assert all(isinstance(pid, int) and pid != stopped for pid in done[1:])
    finally:
        await workers.close()


async def test_a_worker_killed_under_jobs_is_one_warning_and_one_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    metrics = Metrics()
    workers = Workers(2, timeout_s=30, replacements=metrics.compaction.worker_replacements)
    workers.open()
    try:
        jobs = [asyncio.ensure_future(workers.run(nap, 5)) for _ in range(4)]
        await wait_until(lambda: len(workers.pids) == 2)
        await asyncio.sleep(0.5)  # both workers have taken a job
        os.kill(workers.pids[0], signal.SIGKILL)
        done = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 60)
        assert sum(isinstance(result, WorkerLost) for result in done) >= 2  # both running
        assert await workers.run(pid_of, None) != os.getpid()  # compaction goes on
    finally:
        await workers.close()
    assert replaced(metrics.registry, "died") == 1
    assert replaced(metrics.registry, "deadline") is None
    [line] = worker_lines(caplog)
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert "died" in line.getMessage()


async def test_closing_kills_a_stopped_worker() -> None:
    workers = Workers(1, timeout_s=3)
    workers.open()
    stopped = await workers.run(pid_of, None)
    os.kill(stopped, signal.SIGSTOP)
    await asyncio.wait_for(workers.close(), 15)
    assert not is_alive(stopped)


async def test_each_worker_keeps_the_scanned_texts_it_is_given_room_for() -> None:
    # compaction.scanned_texts_mb reaches the workers, whose scanned texts would otherwise be
    # bounded by the library's constant alone, in every process, replaced ones included.
    workers = Workers(1, scanned_chars=12_345)
    workers.open()
    try:
        assert await workers.run(scanned_bound_here, None) == 12_345
        assert worker_mentions().max_chars != 12_345  # this process's own is not touched
    finally:
        await workers.close()


async def test_a_worker_scans_only_the_new_texts_of_a_fold_redone_over_a_longer_history() -> None:
    # A fold sent to a worker carries no cache; the worker keeps its own from job to job, as an
    # inline Compactor does (a precomputed compaction overtaken by the conversation is redone).
    workers = Workers(1)
    workers.open()
    compactor = Compactor(offload=workers)
    longer = simple_conversation(120)
    shorter = longer[:162]  # ends on a user message, as a request does
    folded: list[set[str]] = []
    scanned: list[int] = []
    try:
        for messages in (shorter, longer):
            compaction = await compactor.prepare(messages, window=6000)
            plan = compaction.plan
            result = await compaction.run(llm=ScriptedLLM(), session_id=None)
            assert result.path == "llm"
            folded.append({messages[i]["content"] for i in plan.folded})
            scanned.append(await workers.run(scanned_here, None))
    finally:
        await workers.close()
    first, second = folded
    assert first < second
    # Each folded text scanned once over both folds: the second scanned only its new ones.
    assert scanned == [len(first), len(second)]


async def test_without_workers_a_compactor_keeps_its_jobs_in_process() -> None:
    # Workers(0) runs jobs inline: they carry the messages as they are, and the compactor's own
    # cache of what folds scanned (no JSON packing, no cache left unused).
    workers = Workers(0)
    workers.open()
    compactor = Compactor(offload=workers)
    messages = simple_conversation(120)
    compaction = await compactor.prepare(messages, window=6000)
    plan = compaction.plan
    result = await compaction.run(llm=ScriptedLLM(), session_id=None)
    await workers.close()
    assert (Workers(0).crossing, Workers(1).crossing) == (False, True)
    assert result.path == "llm" and not compactor.crossing
    assert compactor.mentions.scanned == len({messages[i]["content"] for i in plan.folded})


_KILLED_WITH_A_WORKER = """
import asyncio, os, signal
from proxy.compacting.background.workers import WorkerLost, Workers
from proxy.metrics import Metrics
from tests.proxy.compacting.worker_jobs import pid_of

async def main():
    workers = Workers(1)
    workers.open()
    print(await workers.run(pid_of, None), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no shutdown of the pool, as under the OOM killer

asyncio.run(main())
"""


def is_alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between open and read
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def wait_until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def test_workers_end_with_a_proxy_killed_outright() -> None:
    # Its resource tracker, left to clean up after it, says so on stderr: not this test's news.
    parent = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WITH_A_WORKER],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert parent.stdout is not None
    worker = None
    try:
        # One line, not to the end: a worker that outlives the parent holds its stdout open.
        worker = int(parent.stdout.readline())
        assert parent.wait(30) == -signal.SIGKILL
        deadline = time.monotonic() + 10  # the worker notices within milliseconds
        while is_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_alive(worker)
    finally:
        parent.kill()
        parent.stdout.close()
        if worker is not None and is_alive(worker):
            os.kill(worker, signal.SIGKILL)
