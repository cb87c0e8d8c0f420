"""Checkpoint stores: the async, batched interface, checkpoints that round-trip through JSON, and
a store passed in to create_app."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson
import pytest

from compaction.checkpoints import Checkpoint, conversation_seed, prefix_digests
from compaction.marker import SUMMARY_MARKER
from proxy.state.local import LocalStore
from tests import factories as f
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import WINDOW, conversation_of, forwarded, post

SEED = conversation_seed("Bearer sk-client", "agent-1")


def _conversation(turns: int) -> list[dict[str, Any]]:
    return [f.system(), *(f.user(f"question {i}") for i in range(turns))]


def _checkpoint(digests: Sequence[bytes], cut: int, **fields: Any) -> Checkpoint:
    summary = {"role": "user", "content": f"{SUMMARY_MARKER}\nup to {cut}", "x-vendor": [1]}
    return Checkpoint(digests[cut - 1], cut, 1, (cut - 1,), summary, f"c{cut}", "llm", **fields)


def test_a_checkpoint_round_trips_through_json() -> None:
    digests = prefix_digests(_conversation(5), SEED)
    for checkpoint in (
        _checkpoint(digests, 3),
        _checkpoint(digests, 5, parent=digests[2], precomputed=True),
    ):
        data = orjson.loads(orjson.dumps(checkpoint.to_json()))
        assert data["version"] == 1
        assert Checkpoint.from_json(data) == checkpoint


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"version": None},
        {"key": "not hex"},
        {"cut": -1},
        {"cut": 0},
        {"cut": "3"},
        {"pinned": ["a"]},
        {"summary_message": "text"},
        {"parent": 7},
    ],
)
def test_unknown_versions_and_bad_data_are_refused(change: dict[str, Any]) -> None:
    data = {**_checkpoint(prefix_digests(_conversation(4), SEED), 3).to_json(), **change}
    with pytest.raises(ValueError):
        Checkpoint.from_json(data)


@pytest.mark.parametrize("data", [None, [], "x", {"version": 1}])
def test_what_is_not_a_checkpoint_is_refused(data: Any) -> None:
    with pytest.raises(ValueError):
        Checkpoint.from_json(data)


async def test_the_memory_store_answers_the_longest_prefix_in_one_call() -> None:
    messages = _conversation(6)
    digests = prefix_digests(messages, SEED)
    store = LocalStore(max_entries=10, ttl_s=60)
    for cut in (2, 4):
        await store.put(_checkpoint(digests, cut))
    found = await store.longest(digests)
    assert found is not None and found.cut == 4
    shorter = await store.longest(digests[:3])
    assert shorter is not None and shorter.cut == 2
    other = prefix_digests(_conversation(6), conversation_seed("another caller"))
    assert await store.longest(other) is None
    assert await store.longest([]) is None


async def test_a_checkpoint_stored_under_a_digest_of_another_length_is_a_miss() -> None:
    digests = prefix_digests(_conversation(4), SEED)
    store = LocalStore(max_entries=10, ttl_s=60)
    await store.put(replace(_checkpoint(digests, 3), key=digests[1]))
    assert await store.longest(digests) is None


async def test_memory_store_entries_expire_after_their_ttl() -> None:
    now = [0.0]
    digests = prefix_digests(_conversation(3), SEED)
    store = LocalStore(max_entries=10, ttl_s=5, timer=lambda: now[0])
    await store.put(_checkpoint(digests, 2))
    assert await store.longest(digests) is not None
    now[0] = 6.0
    assert await store.longest(digests) is None
    assert len(store) == 0


class JsonStore:
    """A store that keeps only JSON, as a persistent or shared backend would; it counts calls."""

    def __init__(self) -> None:
        self.rows: dict[bytes, bytes] = {}
        self.lookups = 0

    async def longest(self, digests: Sequence[bytes]) -> Checkpoint | None:
        self.lookups += 1
        for cut in range(len(digests), 0, -1):
            row = self.rows.get(digests[cut - 1])
            if row is None:
                continue
            try:
                found = Checkpoint.from_json(orjson.loads(row))
            except ValueError:
                continue
            if found.cut == cut:
                return found
        return None

    async def put(self, checkpoint: Checkpoint) -> None:
        self.rows[checkpoint.key] = orjson.dumps(checkpoint.to_json())


async def test_an_injected_store_serves_reuse_from_json_with_a_byte_identical_prefix(
    start: Any, script: Script, client: Any
) -> None:
    store = JsonStore()
    proxy = await start({"store": store})
    messages = conversation_of(int(WINDOW * 1.1))
    first = await post(client, proxy, messages)
    assert first.headers["x-compaction-status"] == "applied"
    assert len(store.rows) == 1
    messages = [*messages, f.assistant("Here it is."), f.user("Thanks, one more thing.")]
    second = await post(client, proxy, messages)
    assert second.headers["x-compaction-status"] == "reused"
    assert len(script.calls("summary")) == 1
    first_out, second_out = (sent["messages"] for sent in forwarded(script))
    assert orjson.dumps(first_out[:2]) == orjson.dumps(second_out[:2])


async def test_a_stored_row_that_does_not_read_back_is_a_miss(
    start: Any, script: Script, client: Any
) -> None:
    store = JsonStore()
    proxy = await start({"store": store})
    messages = conversation_of(int(WINDOW * 1.1))
    await post(client, proxy, messages)
    for key, row in store.rows.items():
        store.rows[key] = row.replace(b'"version":1', b'"version":99')
    again = await post(client, proxy, [*messages, f.assistant("ok"), f.user("go on")])
    assert again.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 2
