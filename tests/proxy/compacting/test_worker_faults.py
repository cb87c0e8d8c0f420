"""A worker that hangs or dies under requests at the trigger, through the real proxy: requests
are answered in time, the pool is replaced once, and compaction goes on."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.app import WORKERS
from proxy.http import keys
from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, post, wait_for
from tests.proxy.compacting.test_workers import is_alive
from tests.proxy.conftest import RunningProxy

SUMMARY_TIMEOUT_S = 1.0


def over_the_trigger(name: str) -> list[dict[str, Any]]:
    messages = conversation_of(int(WINDOW * 1.3))
    messages[-1] = f.user(f"Now summarize it for {name}.")
    return messages


async def compacted(client: aiohttp.ClientSession, proxy: RunningProxy, name: str) -> str:
    response = await post(client, proxy, over_the_trigger(name), session=name)
    assert response.status == 200
    return response.headers["x-compaction-status"]


async def compacts_again(client: aiohttp.ClientSession, proxy: RunningProxy) -> None:
    """A new conversation is compacted by the summarizer (the new pool's first job starts its
    worker: under load that may take longer than a request waits, so a few may fall back)."""
    for attempt in range(30):
        if await compacted(client, proxy, f"after-{attempt}") == "applied":
            return
    raise AssertionError("compaction did not resume")


def sample(proxy: RunningProxy, name: str, **labels: str) -> float | None:
    return proxy.app[keys.METRICS].registry.get_sample_value(name, labels)


def worker_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "proxy.compacting.background.workers"]


def kill_all(pids: tuple[int, ...]) -> None:
    for pid in pids:
        if is_alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_requests_at_the_trigger_are_answered_while_every_worker_is_stopped(
    start: Any, script: Script, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    proxy = await start(
        compaction={"workers": 2, "summary_timeout_s": SUMMARY_TIMEOUT_S, "worker_timeout_s": 3}
    )
    workers = proxy.app[WORKERS]
    await asyncio.gather(*(compacted(client, proxy, f"warm-{i}") for i in range(4)))
    # Stopped once started: a worker stopped while still importing has its job's deadline wait
    # for it to start (60 s), which a loaded machine's second spawn can make this test meet.
    await wait_for(lambda: workers.started, 30)
    stopped = workers.pids
    assert len(stopped) == 2
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        # One per worker: each plan goes to a stopped worker (see test_workers for those that
        # wait their turn).
        answers = [compacted(client, proxy, f"stuck-{i}") for i in range(2)]
        statuses = await asyncio.wait_for(asyncio.gather(*answers), SUMMARY_TIMEOUT_S + 5)
        assert time.monotonic() - started < SUMMARY_TIMEOUT_S + 5
        assert set(statuses) <= {"failed", "applied"}  # the original, or a fallback
        await wait_for(lambda: not any(is_alive(pid) for pid in stopped), 30)
        await compacts_again(client, proxy)
    finally:
        kill_all(stopped)
    assert set(workers.pids).isdisjoint(stopped)
    assert sample(proxy, "compaction_proxy_worker_replacements_total", reason="deadline") == 1
    assert sample(proxy, "compaction_proxy_compaction_errors_total") == 0
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert len(worker_lines(caplog)) == 1


async def test_a_worker_killed_under_requests_is_one_line_and_one_count(
    start: Any, script: Script, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # Requests wait long enough to still be waiting when the worker dies.
    proxy = await start(compaction={"summary_timeout_s": 30, "worker_timeout_s": 30})
    workers = proxy.app[WORKERS]
    assert await compacted(client, proxy, "warm") == "applied"
    await wait_for(lambda: workers.started, 30)
    [worker] = workers.pids
    # Stopped first so that jobs are surely in flight (one in the worker, the others waiting
    # their turn) when it is killed.
    os.kill(worker, signal.SIGSTOP)
    try:
        answers = asyncio.gather(*(compacted(client, proxy, f"killed-{i}") for i in range(4)))
        await asyncio.sleep(1)
        os.kill(worker, signal.SIGKILL)
        statuses = await asyncio.wait_for(answers, 60)
    finally:
        kill_all((worker,))
    assert set(statuses) <= {"failed", "applied"}
    assert "applied" in statuses  # those waiting their turn went to the new worker
    await compacts_again(client, proxy)
    assert sample(proxy, "compaction_proxy_worker_replacements_total", reason="died") == 1
    assert sample(proxy, "compaction_proxy_compaction_errors_total") == 0
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    [line] = worker_lines(caplog)
    assert line.levelno == logging.WARNING and "died" in line.getMessage()


async def test_a_long_new_request_is_answered_in_time_while_every_worker_is_stopped(
    start: Any, script: Script, client: aiohttp.ClientSession
) -> None:
    """A body long enough to be remembered is indexed in a worker before it is decided: that
    wait is the request's too, counted from its arrival, not the worker's longer deadline."""
    proxy = await start(compaction={"summary_timeout_s": SUMMARY_TIMEOUT_S, "worker_timeout_s": 30})
    workers = proxy.app[WORKERS]
    await compacted(client, proxy, "warm")
    await wait_for(lambda: workers.started, 30)
    stopped = workers.pids
    messages = conversation_of(WINDOW * 6)
    assert len(orjson.dumps(messages)) >= 64 * 1024  # indexed in a worker
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = await asyncio.wait_for(
            post(client, proxy, messages, session="long"), SUMMARY_TIMEOUT_S + 10
        )
        assert time.monotonic() - started < SUMMARY_TIMEOUT_S + 5
        assert response.status == 200
        assert response.headers["x-compaction-status"] in {"failed", "applied"}
    finally:
        kill_all(stopped)


async def test_background_work_lost_with_a_worker_is_not_logged_again(
    start: Any, script: Script, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """A precompute planning in a worker that misses its deadline: the worker's one line and
    one count, and no second line for the background task it took down."""
    caplog.set_level(logging.INFO)
    # Standalone summary requests: this fake summarizer answers a summary without the cached
    # question's <memory> part, which is a warning of its own (not the worker's).
    proxy = await start(
        compaction={
            "precompute_ratio": 0.5,
            "worker_timeout_s": 2,
            "summary_request": "standalone",
        }
    )
    workers = proxy.app[WORKERS]
    assert await compacted(client, proxy, "warm") == "applied"
    await wait_for(lambda: workers.started, 30)
    stopped = workers.pids
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        # Between the precompute ratio and the trigger: forwarded as sent, prepared ahead.
        response = await post(client, proxy, conversation_of(int(WINDOW * 0.65)), session="ahead")
        assert response.headers["x-compaction-status"] == "none"
        name = "compaction_proxy_worker_replacements_total"
        await wait_for(lambda: sample(proxy, name, reason="deadline") == 1, 30)
        await asyncio.sleep(0.5)  # the task that lost its worker ends
    finally:
        kill_all(stopped)
    assert [r for r in caplog.records if r.name == "proxy.tasks"] == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == worker_lines(caplog)
    assert len(worker_lines(caplog)) == 1
    assert sample(proxy, "compaction_proxy_compaction_errors_total") == 0
