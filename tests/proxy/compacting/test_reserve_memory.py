"""A reserve (a checkpoint precomputed ahead of the trigger) writes its memory items when it goes
out, whichever way the request that sends it comes to it: from the store when the view is built,
or as the stored result of the compaction the request itself asked for (another replica, or a
precompute here, stored it between the request's look-up and its lease)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from compaction.checkpoints import Checkpoint
from proxy import keys
from proxy.compacting.stores.memory import MemoryStore
from tests import factories as f
from tests.fakes.script import Script, tokens
from tests.proxy.compacting.conftest import WINDOW, post, wait_for


class LateStore:
    """Checkpoints as a replica sees them in a shared store: one stored elsewhere just after
    this replica looked is missed by that look (`missed_lookups` of them)."""

    def __init__(self) -> None:
        self.inner = MemoryStore(1000, 3600)
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
