"""A reserve (a checkpoint precomputed ahead of the trigger) writes its memory items when it goes
out, whichever way the request that sends it comes to it: from the store when the view is built,
or as the stored result of the compaction the request itself asked for (another replica, or a
precompute here, stored it between the request's look-up and its lease)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from compaction import Compactor, MemoryWriter
from compaction.checkpoints import Checkpoint
from proxy.admin.records import SessionRecords
from proxy.http import keys
from proxy.state.local import LocalStore
from tests import factories as f
from tests.fakes.script import Script, tokens
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import WINDOW, post, wait_for, with_hook
from tests.proxy.conftest import RunningProxy, StartProxy, build_settings


class LateStore:
    """Checkpoints as a replica sees them in a shared store: one stored elsewhere just after
    this replica looked is missed by that look (`missed_lookups` of them)."""

    def __init__(self) -> None:
        self.inner = LocalStore(1000, 3600)
        self.missed_lookups = 0

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        if self.missed_lookups:
            self.missed_lookups -= 1
            return None
        return await self.inner.longest(digests)

    async def put(self, checkpoint: Checkpoint) -> None:
        await self.inner.put(checkpoint)


def just_under_the_trigger() -> list[dict[str, Any]]:
    """A history just under the trigger: a reserve prepared for it folds what a compaction at
    the trigger one short turn later folds (the same checkpoint key)."""
    messages = [f.system()]
    i = 0
    while tokens([*messages, *f.tool_round(i, blocks=1, output_chars=300)]) < 0.845 * WINDOW:
        messages += f.tool_round(i, blocks=1, output_chars=300)
        i += 1
    while tokens(messages) < 0.845 * WINDOW:
        messages += [f.user("go on"), f.assistant("ok")]
    return [*messages, f.user("And now?")]


async def test_a_reserve_met_as_the_stored_result_of_its_own_compaction_writes_its_memory(
    start: Any, script: Script, client: Any, tmp_path: Path
) -> None:
    store = LateStore()
    proxy = await start({"store": store}, compaction={"precompute_ratio": 0.6})
    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    records = proxy.app[keys.RECORDS]
    messages = just_under_the_trigger()
    assert (await post(client, proxy, messages)).headers["x-compaction-status"] == "none"
    await wait_for(lambda: len((records.get("agent-1") or {"records": []})["records"]) == 1)
    reserve = records.get("agent-1")["records"][0]
    assert reserve["reason"] == "precompute" and reserve["memory_items"] > 0
    assert not memory_file.exists()

    # Over the trigger now. The view is built before the reserve shows (missed look-up), so the
    # request compacts, and its compaction finds the reserve stored under its key: that goes out.
    store.missed_lookups = 1
    grown = [*messages, f.assistant("Sure."), f.user("Next?")]
    while tokens(grown) < 0.85 * WINDOW:  # just over: the reserve was made for this growth
        grown[-1] = f.user(grown[-1]["content"] + " Next?")
    response = await post(client, proxy, grown)
    assert response.headers["x-compaction-status"] == "applied"
    assert response.headers["x-compaction-id"] == reserve["id"]
    assert len(script.calls("summary")) == 1  # the reserve's own, nothing more
    lines = [orjson.loads(line) for line in memory_file.read_text().splitlines()]
    assert len(lines) == reserve["memory_items"]
    assert {line["compaction_id"] for line in lines} == {reserve["id"]}

    # Written once: the next request, which finds the reserve in its view, writes nothing again.
    await post(client, proxy, [*grown, f.assistant("Done."), f.user("More?")])
    assert len(memory_file.read_text().splitlines()) == len(lines)


# -- a write that does not happen when the reserve goes out -----------------------------------

SECTIONS: dict[str, Any] = {
    "models": {"default_context_window": WINDOW},
    "compaction": {"keep_recent_rounds": 2, "summary_max_tokens": 300, "precompute_ratio": 0.6},
}


@contextlib.asynccontextmanager
async def proxy_writing_with(
    start_proxy: StartProxy, upstream: FakeUpstream, memory: MemoryWriter, **parts: Any
) -> AsyncIterator[tuple[RunningProxy, SessionRecords]]:
    """A proxy whose memory file is written by `memory`, and the records it keeps."""
    options = build_settings(upstream, **SECTIONS).compaction
    compactor = Compactor(settings=options.library_settings(llm_timeout_s=5), memory=memory)
    records = SessionRecords(max_sessions=10, records_per_session=10)
    parts.update(compactor=compactor, records=records)
    async with with_hook(start_proxy, upstream, SECTIONS, **parts) as proxy:
        yield proxy, records


async def reserve_prepared(
    client: Any,
    proxy: RunningProxy,
    records: SessionRecords,
    messages: list[Any],
    status: str = "none",
) -> dict[str, Any]:
    """The record of the reserve prepared after `messages` (under the trigger, sent with
    `status`) went out."""

    def kept() -> list[dict[str, Any]]:
        return list((records.get("agent-1") or {"records": []})["records"])

    count = len(kept())
    assert (await post(client, proxy, messages)).headers["x-compaction-status"] == status
    await wait_for(lambda: len(kept()) == count + 1)
    reserve = kept()[-1]
    assert reserve["reason"] == "precompute" and reserve["memory_items"] > 0
    return reserve


def grown_over_the_trigger(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` one short turn longer, just over the trigger (a reserve is made for this)."""
    grown = [*messages, f.assistant("Sure."), f.user("Next?")]
    while tokens(grown) < 0.85 * WINDOW:
        grown[-1] = f.user(grown[-1]["content"] + " Next?")
    return grown


def written(memory_file: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in memory_file.read_text().splitlines()]


class Disk:
    """A memory file's `write` on a disk that is full `full_for` more writes (None: for good)."""

    def __init__(self, full_for: int | None) -> None:
        self.full_for = full_for

    def __call__(self, fd: int, data: bytes) -> int:
        if self.full_for is None or self.full_for > 0:
            self.full_for = None if self.full_for is None else self.full_for - 1
            raise OSError(errno.ENOSPC, "no space left on device")
        return os.write(fd, data)


async def test_a_reserve_whose_memory_write_failed_writes_it_when_next_applied(
    start_proxy: StartProxy, upstream: FakeUpstream, script: Script, client: Any, tmp_path: Path
) -> None:
    memory = MemoryWriter(tmp_path / "memory", write=Disk(full_for=1), claims=LocalStore(9, 60))
    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    async with proxy_writing_with(start_proxy, upstream, memory) as (proxy, records):
        messages = just_under_the_trigger()
        reserve = await reserve_prepared(client, proxy, records, messages)

        # Applied at the trigger; writing its items finds the disk full.
        grown = grown_over_the_trigger(messages)
        response = await post(client, proxy, grown)
        assert response.headers["x-compaction-id"] == reserve["id"]
        assert not memory_file.exists()

        # The next request that sends it writes them.
        response = await post(client, proxy, [*grown, f.assistant("Done."), f.user("More?")])
        assert response.headers["x-compaction-id"] == reserve["id"]
        lines = written(memory_file)
        assert len(lines) == reserve["memory_items"]
        assert {line["compaction_id"] for line in lines} == {reserve["id"]}


async def test_a_reserve_whose_memory_write_failed_writes_it_when_sent_under_the_next_reserve(
    start_proxy: StartProxy, upstream: FakeUpstream, script: Script, client: Any, tmp_path: Path
) -> None:
    disk = Disk(full_for=None)
    memory = MemoryWriter(tmp_path / "memory", write=disk)
    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    async with proxy_writing_with(start_proxy, upstream, memory) as (proxy, records):
        messages = just_under_the_trigger()
        first = await reserve_prepared(client, proxy, records, messages)

        # Applied at the trigger, and sent on as the conversation grows past the precompute
        # ratio; every write of its items meets a full disk. The next reserve is prepared: the
        # conversation is grown in one step to a request from its trigger (past halfway from
        # the view after the compaction), the last request that leaves its summary time.
        grown = grown_over_the_trigger(messages)
        response = await post(client, proxy, grown)
        assert response.headers["x-compaction-id"] == first["id"]
        after = int(response.headers["x-compaction-tokens-after"])
        longer = grown[:-1]
        while (
            after + tokens(longer) - tokens(grown) < max(0.7, (0.85 + after / WINDOW) / 2) * WINDOW
        ):
            longer += f.tool_round(100 + len(longer), blocks=1, output_chars=300)
        longer.append(f.user("And then?"))
        second = await reserve_prepared(client, proxy, records, longer, status="reused")
        assert not memory_file.exists()

        # The first goes out again, the second held in reserve: the first's items are written.
        disk.full_for = 0
        response = await post(client, proxy, [*longer, f.assistant("Done."), f.user("More?")])
        assert response.headers["x-compaction-id"] == first["id"] != second["id"]
        lines = written(memory_file)
        assert len(lines) == first["memory_items"]
        assert {line["compaction_id"] for line in lines} == {first["id"]}


class HeldClaims:
    """The state's memory claims, the first claim held until `go` is set (`asked`: reached)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner = inner
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def claim(self, session_id: str, keys: Sequence[str]) -> set[str]:
        self.asked.set()
        await self.go.wait()
        return await self.inner.claim(session_id, keys)

    async def release(self, session_id: str, keys: Sequence[str]) -> None:
        await self.inner.release(session_id, keys)


async def test_a_reserve_applied_for_a_client_that_leaves_meanwhile_still_writes_its_memory(
    start_proxy: StartProxy, upstream: FakeUpstream, script: Script, client: Any, tmp_path: Path
) -> None:
    claims = HeldClaims(LocalStore(9, 60))
    memory = MemoryWriter(tmp_path / "memory", claims=claims)
    memory_file = tmp_path / "memory" / "agent-1" / "compaction_flush.jsonl"
    async with proxy_writing_with(start_proxy, upstream, memory) as (proxy, records):
        messages = just_under_the_trigger()
        reserve = await reserve_prepared(client, proxy, records, messages)

        # Applied at the trigger; the client leaves while its items are being written.
        leaving = asyncio.create_task(post(client, proxy, grown_over_the_trigger(messages)))
        await asyncio.wait_for(claims.asked.wait(), timeout=5)
        leaving.cancel()
        registry = proxy.app[keys.METRICS].registry
        gone = ("compaction_proxy_client_disconnects_total", {"route": "chat"})
        await wait_for(lambda: registry.get_sample_value(*gone) == 1)
        claims.go.set()
        await wait_for(memory_file.exists)
        lines = written(memory_file)
        assert len(lines) == reserve["memory_items"]
        assert {line["compaction_id"] for line in lines} == {reserve["id"]}
