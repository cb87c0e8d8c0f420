"""Long conversations recognized from their last request (proxy.compacting.fast.indexes): the
digests and counts of a full computation, the history a decision reads, a byte-stable prefix,
and no recognition of an edit."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson

from compaction.checkpoints import conversation_seed, prefix_digests
from compaction.messages import CHAT
from compaction.stages import PlanJob
from proxy.compacting.decision.history import ListHistory
from proxy.compacting.fast.indexes import BodyIndexes
from proxy.compacting.fast.indexing import IndexJob
from tests import factories as f
from tests.fakes.offload import RecordingOffload
from tests.fakes.script import Script
from tests.proxy.compacting.conftest import post, with_hook

BIG_WINDOW = 40_000  # bodies past the 64 KiB below which nothing is remembered
CHAT_ITEMS: dict[str, Any] = {"items_key": "messages", "shape": CHAT}
SEED = conversation_seed("tenant", "session")


def long_history(turns: int) -> list[dict[str, Any]]:
    messages = [f.system()]
    for i in range(turns):
        messages.append(f.user(f"Question {i}: " + f.ENGLISH_SAMPLE * 20))
        messages.append(f.assistant(f"Answer {i}: " + f.ENGLISH_SAMPLE * 20))
    messages.append(f.user("And now?"))
    return messages


def grown(messages: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    return [*messages, f.assistant(f"Reply {step}."), f.user(f"Next question {step}?")]


def chat(messages: list[dict[str, Any]], **fields: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, **fields})


async def learned(first: list[dict[str, Any]], **fields: Any) -> tuple[BodyIndexes, int]:
    """BodyIndex requests that learned the body `chat(first, **fields)`, and its key."""
    known = BodyIndexes(max_bytes=1 << 30, min_body_bytes=0)
    body = chat(first, **fields)
    key = known.conversation_key("scope", body)
    assert key is not None
    found = await known.learn(key, body, len(first), seed=SEED, opening=first[:2], **CHAT_ITEMS)
    assert found is not None
    return known, key


async def replay(start: Any, script: Script, client: Any, **compaction: Any) -> list[bytes]:
    proxy = await start(models={"default_context_window": BIG_WINDOW}, compaction=compaction)
    messages = long_history(110)  # about 1.1 windows
    statuses = []
    for step in range(4):
        response = await post(client, proxy, messages)
        statuses.append(response.headers["x-compaction-status"])
        messages = grown(messages, step)
    assert statuses == ["applied", "reused", "reused", "reused"]
    return [r.body for r in script.calls(None)]


async def test_the_forwarded_prefix_stays_byte_identical_across_requests(
    start: Any, script: Script, client: Any
) -> None:
    bodies = await replay(start, script, client)
    for before, after in itertools.pairwise(bodies):
        assert after.startswith(before[: -len(b"]}")])


async def test_an_edited_history_is_not_taken_for_the_known_one(
    start: Any, script: Script, client: Any
) -> None:
    proxy = await start(models={"default_context_window": BIG_WINDOW})
    messages = long_history(110)
    await post(client, proxy, messages)
    edited = grown(messages, 0)
    edited[3] = f.user("Edited question: " + f.ENGLISH_SAMPLE * 20)
    response = await post(client, proxy, edited)
    assert response.headers["x-compaction-status"] == "applied"
    assert len(script.calls("summary")) == 2


async def test_a_recognized_body_gets_the_digests_and_counts_of_a_full_computation() -> None:
    first = long_history(3)
    known, key = await learned(first, stream=True)
    second = grown(first, 1)
    body2 = chat(second, stream=True)
    seen = known.recognize(key, body2, "messages")
    assert seen is not None
    assert seen.fields == {"model": "m", "messages": [], "stream": True}
    assert seen.added == second[-2:]
    extended = known.extend(key, seen)
    assert extended.digests == prefix_digests(second, SEED)
    full = await BodyIndexes(max_bytes=1 << 30, min_body_bytes=0).learn(
        key, body2, len(second), seed=SEED, opening=second[:2], **CHAT_ITEMS
    )
    assert full is not None
    assert extended.tokens == full.tokens
    assert extended.items == full.items


async def test_at_most_max_conversations_are_remembered_the_least_recently_seen_forgotten() -> None:
    # The count bound binds where bodies are small (a byte bound alone would hold thousands of
    # them); the conversation seen last is recognized, the one not seen since is not.
    known = BodyIndexes(max_bytes=1 << 30, min_body_bytes=0, max_conversations=2)
    histories = [long_history(2 + n) for n in range(3)]
    keys = []
    for n, first in enumerate(histories):
        body = chat(first)
        key = known.conversation_key(f"scope-{n}", body)
        assert key is not None
        assert await known.learn(key, body, len(first), seed=SEED, opening=first[:2], **CHAT_ITEMS)
        keys.append(key)
    assert known.recognize(keys[0], chat(grown(histories[0], 1)), "messages") is None
    for key, first in zip(keys[1:], histories[1:], strict=True):
        assert known.recognize(key, chat(grown(first, 1)), "messages") is not None


async def test_a_body_that_does_not_continue_the_known_one_is_not_recognized() -> None:
    first = long_history(12)
    known, key = await learned(first)
    # An edit further back than the last few items: not recognized.
    edited = [*first[:3], f.assistant("another answer"), *first[4:]]
    assert known.recognize(key, chat(edited), "messages") is None
    other_model = orjson.dumps({"model": "n", "messages": grown(first, 1)})
    assert known.recognize(key, other_model, "messages") is None


async def test_a_continuation_says_whether_its_fields_are_the_known_ones() -> None:
    # What the fast path reads a conversation's opening from (Dialect.opening) besides its first
    # items: the fields around the list. Unchanged, the opening is not read again.
    first = long_history(3)
    known, key = await learned(first, temperature=0.2)
    for body, same in [
        (chat(grown(first, 1), temperature=0.2), True),
        (chat(first, temperature=0.2), True),
        (chat([*first[:-2], f.user("other")], temperature=0.2), True),  # took back its last items
        (chat(grown(first, 1), temperature=0.3), False),
        (chat(grown(first, 1), temperature=0.2, tools=[{"name": "t"}]), False),
        (chat(grown(first, 1)), False),
    ]:
        seen = known.recognize(key, body, "messages")
        assert seen is not None and seen.fields_unchanged is same, (body[-60:], same)
        assert (seen.fields == {"model": "m", "messages": [], "temperature": 0.2}) is same


async def test_a_body_that_took_back_its_last_items_is_recognized_up_to_them() -> None:
    first = long_history(12)
    known, key = await learned(first)
    shorter = [*first[:-2], f.user("other")]
    seen = known.recognize(key, chat(shorter), "messages")
    assert seen is not None and seen.added == shorter[-1:]
    assert list(known.extend(key, seen).prefix_digests()) == prefix_digests(shorter, SEED)


async def test_two_continuations_of_one_request_each_get_their_own_digests() -> None:
    first = long_history(3)
    known, key = await learned(first)
    one, other = grown(first, 1), grown(first, 2)
    seen_one = known.recognize(key, chat(one), "messages")
    seen_other = known.recognize(key, chat(other), "messages")
    assert seen_one is not None and seen_other is not None
    extended_one = known.extend(key, seen_one)
    extended_other = known.extend(key, seen_other)  # branches off the same request
    assert list(extended_one.prefix_digests()) == prefix_digests(one, SEED)
    assert list(extended_other.prefix_digests()) == prefix_digests(other, SEED)
    assert extended_one.tokens[: extended_one.count + 1] == extended_other.tokens[: len(one) + 1]


async def test_the_prefix_keeps_its_bytes_when_a_conversation_starts_being_remembered(
    start: Any, script: Script, client: Any
) -> None:
    # A client that writes JSON its own way (Python's json: ", " and ": "): bodies under 64 KiB
    # are not remembered, bodies past it are; a reused view must go out as the same bytes.
    proxy = await start(models={"default_context_window": 6000})
    messages = long_history(12)
    statuses, sent = [], []
    for step in range(12):
        body = json.dumps({"model": "gpt-test", "messages": messages}).encode()
        sent.append(len(body))
        headers = {"Authorization": "Bearer sk", "X-Session-Id": "stdlib-json"}
        async with client.post(
            f"{proxy.url}/v1/chat/completions", data=body, headers=headers
        ) as response:
            await response.read()
            statuses.append(response.headers["x-compaction-status"])
        messages = [
            *messages,
            f.assistant(f"Reply {step}. " + f.ENGLISH_SAMPLE * 20),
            f.user(f"Next question {step}? " + f.ENGLISH_SAMPLE * 20),
        ]
    bodies = [r.body for r in script.calls(None)]
    assert max(sent) > 64 * 1024 > min(sent)
    pairs = list(zip(statuses, statuses[1:], itertools.pairwise(bodies), strict=False))
    reused_after_compaction = [
        (b, a) for s0, s1, (b, a) in pairs if s0 != "none" and s1 == "reused"
    ]
    assert reused_after_compaction
    for before, after in reused_after_compaction:
        assert after.startswith(before[: before.rfind(b"]")])


_COMPACTING_AT_ONCE: dict[str, Any] = {
    "models": {"default_context_window": BIG_WINDOW},
    "compaction": {"keep_recent_rounds": 2, "precompute_ratio": 0},
}


async def test_a_remembered_history_crosses_to_the_worker_as_the_clients_bytes(
    start_proxy: Any, upstream: Any, script: Script, client: Any
) -> None:
    # Serializing a long history again for the worker process costs the event loop 60-70 ms
    # at 50 MiB; a remembered body's messages array is already JSON.
    offload = RecordingOffload()
    sections = _COMPACTING_AT_ONCE
    async with with_hook(start_proxy, upstream, sections, offload=offload) as proxy:
        messages = long_history(110)  # about 1.1 windows
        body = json.dumps({"model": "gpt-test", "messages": messages}, indent=1).encode()
        headers = {"Authorization": "Bearer sk", "X-Session-Id": "indented"}
        async with client.post(
            f"{proxy.url}/v1/chat/completions", data=body, headers=headers
        ) as response:
            assert response.headers["x-compaction-status"] == "applied"
    (planned,) = [job for job in offload.jobs if isinstance(job, PlanJob)]
    sent = planned.messages.json  # the body as received, where its array is
    assert sent.data == body and sent.load() == messages
    assert orjson.loads(script.calls(None)[-1].body)["messages"][-1] == messages[-1]


async def test_an_edited_and_grown_history_crosses_to_the_worker_as_its_own_array(
    start_proxy: Any, upstream: Any, script: Script, client: Any
) -> None:
    # Continuation from the last body with its last turn edited: the array the worker gets is
    # the one in this body, of exactly its messages, never the remembered body's.
    offload = RecordingOffload()
    sections = _COMPACTING_AT_ONCE
    headers = {"Authorization": "Bearer sk", "X-Session-Id": "edited"}
    async with with_hook(start_proxy, upstream, sections, offload=offload) as proxy:
        first = long_history(30)  # below the trigger: remembered, not compacted
        second = [*first[:-1], f.user("No: do it the other way."), *long_history(20)[1:]]
        statuses = []
        for messages in (first, second):
            body = orjson.dumps({"model": "gpt-test", "messages": messages})
            async with client.post(
                f"{proxy.url}/v1/chat/completions", data=body, headers=headers
            ) as response:
                statuses.append(response.headers["x-compaction-status"])
    assert statuses == ["none", "applied"]
    # The second was recognized (remembered from the first, not learned anew).
    assert len([job for job in offload.jobs if isinstance(job, IndexJob)]) == 1
    (planned,) = [job for job in offload.jobs if isinstance(job, PlanJob)]
    sent = planned.messages.json
    assert sent is not None and sent.data == body and sent.load() == second


async def test_a_remembered_index_reads_as_the_history_of_the_parsed_list() -> None:
    # The one decision reads either: the same length, counts, digests and items.
    first = long_history(3)
    known, key = await learned(first)
    seen = known.recognize(key, chat(grown(first, 1)), "messages")
    assert seen is not None
    index = known.extend(key, seen)
    parsed = ListHistory(grown(first, 1), SEED, CHAT)
    assert len(index) == len(parsed)
    assert [index.tokens_to(i) for i in range(len(index) + 1)] == [
        parsed.tokens_to(i) for i in range(len(parsed) + 1)
    ]
    assert list(index.prefix_digests()) == list(parsed.prefix_digests())
    assert [index.item(i) for i in range(len(index))] == grown(first, 1)
