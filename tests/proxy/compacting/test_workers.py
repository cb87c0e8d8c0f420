"""The worker processes a compaction's CPU work runs in."""

from __future__ import annotations

import os
from concurrent.futures.process import BrokenProcessPool

import pytest

from compaction import Compactor
from compaction.stages import worker_mentions
from proxy.compacting.workers import Workers
from tests.compaction.conftest import ScriptedLLM
from tests.factories import simple_conversation


def pid_of(_: None) -> int:
    return os.getpid()


def die(_: None) -> None:
    os._exit(3)


def scanned_here(_: None) -> int:
    return worker_mentions().scanned


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
            plan = compactor.plan(messages, window=6000)
            result = await compactor.run(messages, plan, llm=ScriptedLLM(), session_id=None)
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
    plan = compactor.plan(messages, window=6000)
    result = await compactor.run(messages, plan, llm=ScriptedLLM(), session_id=None)
    await workers.close()
    assert (Workers(0).crossing, Workers(1).crossing) == (False, True)
    assert result.path == "llm" and len(compactor.packings) == 0
    assert compactor.mentions.scanned == len({messages[i]["content"] for i in plan.folded})
