"""The fast path (proxy.compacting.fast.path) in every dialect: growing conversations sent
through the real proxy are mostly answered from what is remembered, with the statuses, sessions
and bytes the decision calls for; odd requests (two lists, an upstream-held history, edits,
parallel sessions) are answered right or left to the full path."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import factories as f
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.fast.drive import (
    DIALECTS,
    RECOGNIZED,
    WINDOW,
    body_of,
    conversation,
    drive,
    grown,
    headers_of,
    history,
    list_end,
    metric,
)


@pytest.mark.parametrize("session", [None, "agent-1"], ids=["fingerprint", "named"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_long_conversation_is_answered_from_what_is_remembered(
    start: Any,
    script: Script,
    client: Any,
    upstream: FakeUpstream,
    tmp_path: Path,
    dialect: str,
    session: str | None,
) -> None:
    # Late on, Anthropic's head changes (its `system`, written after the list): without a named
    # session that is another conversation (the fingerprint of the opening names it), with one
    # the same conversation, counted with its new head.
    run = await drive(
        start,
        script,
        client,
        upstream,
        tmp_path,
        dialect,
        conversation(dialect, 9),
        session=session,
        system_change_at=7,
    )
    statuses = [outcome[0] for outcome in run.outcomes]
    assert "applied" in statuses and statuses.count("reused") >= 3, statuses
    assert run.decided_known[-1] >= 4
    sessions = [outcome[3] for outcome in run.outcomes]
    if session is not None:
        assert set(sessions) == {session}
    elif dialect == "anthropic":  # its head is the `system` that changed
        assert len(set(sessions[:7])) == 1 and sessions[6] != sessions[7] == sessions[8]
    else:
        assert len(set(sessions)) == 1


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_after_a_reserve_is_applied_requests_are_answered_from_what_is_known_again(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    run = await drive(
        start,
        script,
        client,
        upstream,
        tmp_path,
        dialect,
        conversation(dialect, 14),
        session="agent-1",
        precompute_ratio=0.75,
    )
    assert run.memory  # the applied reserves' memory-file items, written once
    # A reserve goes out ("applied" with a checkpoint prepared ahead) and the requests that reuse
    # it are answered from what is remembered, right after it too (its view is below the
    # precompute ratio); only the two that check whether to prepare the next reserve (once the
    # view passes the ratio) take the full path: that check needs the parsed messages.
    statuses = [outcome[0] for outcome in run.outcomes]
    reserves = [
        i
        for i, outcome in enumerate(run.outcomes)
        if outcome[0] == "applied" and run.reasons[outcome[4]] == "precompute"
    ]
    assert reserves, run.outcomes
    longest = 0
    for reserve in reserves:
        reuses = []
        for i in range(reserve + 1, len(statuses)):
            if statuses[i] != "reused":
                break
            reuses.append(i)
        answered = [i for i in reuses if run.decided_known[i] > run.decided_known[i - 1]]
        assert len(answered) >= len(reuses) - 2, (reserve, run.decided_known)
        assert answered[:2] == reuses[:2], (reserve, run.decided_known)
        longest = max(longest, len(answered))
    assert longest >= 4, run.outcomes


async def test_a_known_responses_conversation_continued_upstream_passes_through(
    start: Any, script: Script, client: Any, upstream: FakeUpstream
) -> None:
    proxy = await start(models={"default_context_window": WINDOW})
    *earlier, last = conversation("responses", 5)
    url, headers = f"{proxy.url}/v1/responses", headers_of("responses", "r1")
    statuses = []
    for messages in earlier:
        async with client.post(url, data=body_of("responses", messages), headers=headers) as r:
            await r.read()
            statuses.append(r.headers["x-compaction-status"])
    assert statuses[-1] == "reused", statuses
    # The bytes up to the end of the known list match; `previous_response_id` comes after it:
    # the history lives upstream, nothing to compact.
    body = orjson.dumps({**orjson.loads(body_of("responses", last)), "previous_response_id": "r"})
    async with client.post(url, data=body, headers=headers) as response:
        await response.read()
        assert response.headers["x-compaction-status"] == "none"
    assert script.upstream.requests[-1].body == body


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_client_writing_json_its_own_way_keeps_its_bytes(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    # Kept items go out as the client wrote them: a forwarded prefix that keeps its bytes from
    # one reused request to the next.
    requests = conversation(dialect, 6)
    run = await drive(start, script, client, upstream, tmp_path, dialect, requests, spaced=True)
    assert run.decided_known[-1] >= 2
    statuses = [outcome[0] for outcome in run.outcomes]
    assert "reused" in statuses
    for (before, after), status in zip(
        itertools.pairwise(run.forwarded), statuses[1:], strict=True
    ):
        if status == "reused":
            assert after.startswith(before[: list_end(before, dialect)])
            assert b'", "' in after  # the client's own spacing, not orjson's


@pytest.mark.parametrize("dialect", ["chat", "responses"])
async def test_a_first_user_message_after_a_long_opening_names_the_session(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    # A long first body without a user message (a big system prompt, a greeting): the
    # fingerprint that names the session reads the first user message, which only the next
    # request brings. The fast path must see it too (then the seed differs: a conversation of
    # another session, left to the full path).
    opening = [f.system("Rules. " * 9_800), f.assistant("Ready.")]
    requests = [opening, [*opening, f.user("Fix the build.")]]
    run = await drive(start, script, client, upstream, tmp_path, dialect, requests)
    assert run.outcomes[0][3] != run.outcomes[1][3]


async def _send(
    start: Any, script: Script, client: Any, bodies: list[bytes], known_mb: float
) -> tuple[list[str], list[bytes]]:
    """Chat bodies sent in order through a proxy: the statuses, the bodies forwarded."""
    script.upstream.requests.clear()
    proxy = await start(
        models={"default_context_window": WINDOW}, compaction={"known_requests_mb": known_mb}
    )
    statuses = []
    for body in bodies:
        async with client.post(
            f"{proxy.url}/v1/chat/completions", data=body, headers=headers_of("chat", "dup")
        ) as response:
            await response.read()
            assert response.status == 200
            statuses.append(response.headers["x-compaction-status"])
    return statuses, [r.body for r in script.calls(None)]


def _with_second_list(body: bytes, messages: list[Any]) -> bytes:
    """`body` with a second `messages` member at its end: the one a JSON parser keeps."""
    assert body.endswith(b"}")
    return body[:-1] + b',"messages":' + orjson.dumps(messages) + b"}"


@pytest.mark.parametrize("known_mb", [64, 0], ids=["remembered", "not-remembered"])
async def test_a_compacted_request_with_two_lists_compacts_the_one_a_parser_keeps(
    start: Any, script: Script, client: Any, known_mb: float
) -> None:
    # The first `messages` has the count, first and last items of the second: the spliced
    # list must be the one the upstream reads, not the first one.
    messages = history("chat", 1.3)
    decoy = [*messages[:1], f.user("something else"), *messages[2:]]
    body = _with_second_list(body_of("chat", decoy), messages)
    statuses, forwarded = await _send(start, script, client, [body], known_mb)
    assert statuses == ["applied"]
    sent = orjson.loads(forwarded[0])["messages"]
    assert len(sent) < len(messages)


async def test_a_continuation_with_an_empty_second_list_goes_out_as_sent(
    start: Any, script: Script, client: Any
) -> None:
    # The list a parser keeps is the empty one: nothing to compact, whatever came before it.
    first = history("chat", 1.3)
    second = grown(first, 0)
    bodies = [body_of("chat", first), _with_second_list(body_of("chat", second), [])]
    statuses, forwarded = await _send(start, script, client, bodies, 64)
    assert statuses == ["applied", "none"]
    assert forwarded[1] == bodies[1]


async def test_an_anthropic_client_moving_its_cache_marks_is_still_recognized(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path
) -> None:
    # The cache_control marks move to the newest user turns: each request edits an item near
    # the end of the previous one. The items before it are still known.
    requests = conversation("anthropic", 8)
    run = await drive(start, script, client, upstream, tmp_path, "anthropic", requests, marked=True)
    statuses = [outcome[0] for outcome in run.outcomes]
    assert "applied" in statuses and statuses.count("reused") >= 3, statuses
    assert run.decided_known[-1] >= 3, run.decided_known


def _edited(messages: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """`messages` with message `index`'s text changed, its length kept."""
    message = messages[index]
    text = message["content"] or "x"
    return [*messages[:index], {**message, "content": text[::-1]}, *messages[index + 1 :]]


@pytest.mark.parametrize("where", ["near-the-end", "early", "rewound"])
@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
async def test_a_client_editing_an_earlier_message_is_recognized_again(
    start: Any,
    script: Script,
    client: Any,
    upstream: FakeUpstream,
    tmp_path: Path,
    dialect: str,
    where: str,
) -> None:
    # From the fourth request on, one message the previous requests held is edited in place
    # (same length): just before the last turn, or at the start of the history; or the last
    # turns are taken back. The conversation goes on from the edited history, and the fast
    # path takes it up again.
    requests = conversation(dialect, 7)
    if where == "rewound":  # the last turns taken back, another request instead
        edited = [*requests[:3], [*requests[2][:-2], f.user("Try another way.")]]
        for step in range(3):
            edited.append(grown(edited[-1], 10 + step))
    else:
        at = len(requests[2]) - 2 if where == "near-the-end" else 2
        edited = [*requests[:3], *(_edited(messages, at) for messages in requests[3:])]
    run = await drive(start, script, client, upstream, tmp_path, dialect, edited, session="agent-1")
    assert run.decided_known[-1] >= 2, run.decided_known


async def test_parallel_conversations_opening_alike_are_each_recognized(
    start: Any, script: Script, client: Any, upstream: FakeUpstream
) -> None:
    # Two sessions of one agent under one key, no session named: a system prompt longer than
    # 4 KiB makes their first bytes alike; their requests alternate. Each is the continuation
    # of its own previous request.
    head = f.system("You are a careful coding assistant. " * 160)
    conversations = []
    for name in ("a", "b"):
        first = [head, f.user(f"Task {name}."), *history("chat", 0.7)[1:]]
        requests = [first]
        for step in range(3):
            requests.append(grown(requests[-1], step))
        conversations.append(requests)
    bodies = [body_of("chat", m) for pair in zip(*conversations, strict=True) for m in pair]
    proxy = await start(models={"default_context_window": WINDOW})
    sessions = []
    for body in bodies:
        async with client.post(
            f"{proxy.url}/v1/chat/completions", data=body, headers=headers_of("chat", None)
        ) as response:
            await response.read()
            assert response.status == 200
            sessions.append(response.headers["x-compaction-session"])
    assert await metric(client, proxy.url, RECOGNIZED) == len(bodies) - 2
    assert sessions[0::2] == [sessions[0]] * 4 and sessions[1::2] == [sessions[1]] * 4
    assert sessions[0] != sessions[1]
