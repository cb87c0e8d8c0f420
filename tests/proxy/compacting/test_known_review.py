"""Odd requests on the recognised-request path (proxy.compacting.fast.indexes, recall): what the full
path would give them, or the full path itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import factories as f
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.known_drive import (
    RECOGNIZED,
    WINDOW,
    assert_same_as_full,
    body_of,
    conversation,
    drive_both,
    grown,
    headers_of,
    history,
    metric,
)


@pytest.mark.parametrize("dialect", ["chat", "responses"])
async def test_a_first_user_message_after_a_long_opening_names_the_session_on_both_paths(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    # A long first body without a user message (a big system prompt, a greeting): the
    # fingerprint that names the session reads the first user message, which only the next
    # request brings. The recognised path must see it too (then the seed differs: a conversation
    # of another session, left to the full path).
    opening = [f.system("Rules. " * 9_800), f.assistant("Ready.")]
    requests = [opening, [*opening, f.user("Fix the build.")]]
    common: dict[str, Any] = {"requests": requests}
    known, full = await drive_both(start, script, client, upstream, tmp_path, dialect, **common)
    assert [o[3] for o in known.outcomes] == [o[3] for o in full.outcomes]
    assert known.outcomes[0][3] != known.outcomes[1][3]


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


async def test_a_continuation_with_an_empty_second_list_is_decided_as_on_the_full_path(
    start: Any, script: Script, client: Any
) -> None:
    first = history("chat", 1.3)
    second = grown(first, 0)
    bodies = [body_of("chat", first), _with_second_list(body_of("chat", second), [])]
    known = await _send(start, script, client, bodies, 64)
    full = await _send(start, script, client, bodies, 0)
    assert known == full


async def test_an_anthropic_client_moving_its_cache_marks_is_still_recognized(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path
) -> None:
    # The cache_control marks move to the newest user turns: each request edits an item near
    # the end of the previous one. The items before it are still known.
    common: dict[str, Any] = {"requests": conversation("anthropic", 8), "marked": True}
    known, full = await drive_both(start, script, client, upstream, tmp_path, "anthropic", **common)
    statuses = [outcome[0] for outcome in known.outcomes]
    assert "applied" in statuses and statuses.count("reused") >= 3, statuses
    assert_same_as_full(known, full)
    assert known.decided_known[-1] >= 3, known.decided_known


def _edited(messages: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """`messages` with message `index`'s text changed, its length kept."""
    message = messages[index]
    text = message["content"] or "x"
    return [*messages[:index], {**message, "content": text[::-1]}, *messages[index + 1 :]]


@pytest.mark.parametrize("where", ["near-the-end", "early", "rewound"])
@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
async def test_a_client_editing_an_earlier_message_gets_what_the_full_path_gives_it(
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
    # turns are taken back. The conversation goes on from the edited history.
    requests = conversation(dialect, 7)
    if where == "rewound":  # the last turns taken back, another request instead
        edited = [*requests[:3], [*requests[2][:-2], f.user("Try another way.")]]
        for step in range(3):
            edited.append(grown(edited[-1], 10 + step))
    else:
        at = len(requests[2]) - 2 if where == "near-the-end" else 2
        edited = [*requests[:3], *(_edited(messages, at) for messages in requests[3:])]
    common: dict[str, Any] = {"requests": edited, "session": "agent-1"}
    known, full = await drive_both(start, script, client, upstream, tmp_path, dialect, **common)
    assert_same_as_full(known, full)
    assert known.decided_known[-1] >= 2, known.decided_known


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
    runs = []
    for known_mb in (64, 0):
        script.upstream.requests.clear()
        proxy = await start(
            models={"default_context_window": WINDOW}, compaction={"known_requests_mb": known_mb}
        )
        outcomes = []
        for body in bodies:
            async with client.post(
                f"{proxy.url}/v1/chat/completions", data=body, headers=headers_of("chat", None)
            ) as response:
                await response.read()
                got = response.headers
                outcomes.append((got["x-compaction-status"], got["x-compaction-session"]))
        recognized = await metric(client, proxy.url, RECOGNIZED)
        runs.append((outcomes, [r.body for r in script.calls(None)], recognized))
    (outcomes, forwarded, recognized), full = runs
    assert recognized == len(bodies) - 2, outcomes
    assert (outcomes, forwarded) == full[:2]
    assert len({session for _, session in outcomes}) == 2
