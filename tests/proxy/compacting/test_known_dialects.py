"""The recognised-request path (proxy.compacting.fast.indexes, recall) in every dialect: growing
conversations sent through the real proxy with the path on and off (`known_requests_mb: 0`) give
the upstream the same bytes, the agent the same statuses, and use the same checkpoints; after a
precomputed reserve is applied, the next requests are decided from what is remembered again."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.known_drive import (
    DIALECTS,
    WINDOW,
    assert_same_as_full,
    body_of,
    conversation,
    drive_both,
    headers_of,
    list_end,
)


@pytest.mark.parametrize("session", [None, "agent-1"], ids=["fingerprint", "named"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_recognized_conversation_gets_what_the_full_path_gives_it(
    start: Any,
    script: Script,
    client: Any,
    upstream: FakeUpstream,
    tmp_path: Path,
    dialect: str,
    session: str | None,
) -> None:
    # Late on, the head changes (Anthropic's `system`, written after the list): without a named
    # session that is another conversation (the fingerprint of the opening names it), with one
    # the same conversation, counted with its new head.
    common: dict[str, Any] = {
        "requests": conversation(dialect, 9),
        "system_change_at": 7,
        "session": session,
    }
    known, full = await drive_both(start, script, client, upstream, tmp_path, dialect, **common)
    statuses = [outcome[0] for outcome in known.outcomes]
    assert "applied" in statuses and statuses.count("reused") >= 3, statuses
    assert_same_as_full(known, full)
    assert known.decided_known[-1] >= 4
    assert full.decided_known[-1] == 0


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_after_a_reserve_is_applied_requests_are_decided_from_what_is_known_again(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    common: dict[str, Any] = {
        "requests": conversation(dialect, 14),
        "session": "agent-1",
        "precompute_ratio": 0.75,
    }
    known, full = await drive_both(start, script, client, upstream, tmp_path, dialect, **common)
    assert_same_as_full(known, full)
    assert known.memory  # the applied reserves' memory items, written once
    assert known.reasons == full.reasons
    # A reserve goes out ("applied" with a checkpoint prepared ahead) and the requests that reuse
    # it are decided from what is remembered, right after it too (its view is below the
    # precompute ratio); only the two that check whether to prepare the next reserve (once the
    # view passes the ratio) take the full path: that check needs the parsed messages.
    statuses = [outcome[0] for outcome in known.outcomes]
    reserves = [
        i
        for i, outcome in enumerate(known.outcomes)
        if outcome[0] == "applied" and known.reasons[outcome[4]] == "precompute"
    ]
    longest = 0
    for reserve in reserves:
        reuses = []
        for i in range(reserve + 1, len(statuses)):
            if statuses[i] != "reused":
                break
            reuses.append(i)
        known_decided = [i for i in reuses if known.decided_known[i] > known.decided_known[i - 1]]
        assert len(known_decided) >= len(reuses) - 2, (reserve, known.decided_known)
        assert known_decided[:2] == reuses[:2], (reserve, known.decided_known)
        longest = max(longest, len(known_decided))
    assert longest >= 4, known.outcomes


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
async def test_a_client_writing_json_its_own_way_keeps_its_bytes_on_both_paths(
    start: Any, script: Script, client: Any, upstream: FakeUpstream, tmp_path: Path, dialect: str
) -> None:
    # Kept items go out as the client wrote them, remembered or not: the same bodies, and a
    # forwarded prefix that keeps its bytes from one reused request to the next.
    common: dict[str, Any] = {"requests": conversation(dialect, 6), "spaced": True}
    known, full = await drive_both(start, script, client, upstream, tmp_path, dialect, **common)
    assert known.forwarded == full.forwarded
    assert known.decided_known[-1] >= 2
    statuses = [outcome[0] for outcome in known.outcomes]
    for (before, after), status in zip(
        itertools.pairwise(known.forwarded), statuses[1:], strict=True
    ):
        if status == "reused":
            assert after.startswith(before[: list_end(before, dialect)])
            assert b'", "' in after  # the client's own spacing, not orjson's
