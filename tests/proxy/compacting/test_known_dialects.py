"""The recognised-request path (proxy.compacting.known, recall) in every dialect: growing
conversations sent through the real proxy with the path on and off (`known_requests_mb: 0`) give
the upstream the same bytes, the agent the same statuses, and use the same checkpoints; after a
precomputed reserve is applied, the next requests are decided from what is remembered again."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.dialects import WIRES
from proxy import keys
from proxy.compacting.spans import locate_value, scan_items
from tests import factories as f
from tests.fakes.script import Script
from tests.fakes.upstream import FakeUpstream
from tests.proxy.compacting.conftest import wait_for

# Bodies must pass the 64 KiB below which nothing is remembered: a window of 24k tokens is about
# 96 KB of history in each dialect.
WINDOW = 24_000
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
DIALECTS = ["chat", "responses", "anthropic"]
RECOGNIZED = "compaction_proxy_recognized_requests_total"


def history(dialect: str, share: float) -> list[dict[str, Any]]:
    """A coding-agent history of about `share` of the window in `dialect`, ending in a request."""
    messages = [f.system()]
    i = 0
    while tokens(dialect, [*messages, f.user("Go on.")]) < share * WINDOW:
        messages += f.tool_round(i, blocks=2, output_chars=900)
        i += 1
    return [*messages, f.user(f"Now do task {i}.")]


def grown(messages: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The agent's next request: a tool call answered, a reply, a new request (about 5% of the
    window in every dialect)."""
    output = f"output {step} " * 280
    return [
        *messages,
        *f.tool_block(1, output=output),
        f.assistant(f"Step {step} done."),
        f.user(f"Next step {step}?"),
    ]


def conversation(dialect: str, steps: int) -> list[list[dict[str, Any]]]:
    """The histories of `steps` requests of one conversation, starting at 0.8 of the window
    (built once: both passes must send the same call ids)."""
    requests = [history(dialect, 0.8)]
    for step in range(steps - 1):
        requests.append(grown(requests[-1], step))
    return requests


def tokens(dialect: str, messages: list[dict[str, Any]]) -> int:
    wire = WIRES[dialect]
    return wire.tokens(wire.body(messages, TOOLS))


def body_of(
    dialect: str, messages: list[dict[str, Any]], system: str = "", *, spaced: bool = False
) -> bytes:
    """The request as that API's client sends it: Responses items without `role` (reasoning
    with encrypted_content, function_call, function_call_output); Anthropic thinking blocks with
    signatures, tool_use / tool_result, and a `system` with cache_control written after the list
    (so the bytes of the known prefix do not cover it). `spaced`: written by Python's json
    (", " and ": "), not as orjson writes it."""
    payload = WIRES[dialect].body(messages, TOOLS)
    if dialect == "responses":
        payload.update(store=False, include=["reasoning.encrypted_content"])
    if dialect == "anthropic":
        head = payload.pop("system")
        head[0]["text"] += system
        payload.update(system=head, thinking={"type": "enabled", "budget_tokens": 1024})
    return json.dumps(payload).encode() if spaced else orjson.dumps(payload)


def headers_of(dialect: str, session: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-client"}
    if dialect == "anthropic":
        headers.update({"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"})
    if session is not None:
        headers["X-Session-Id"] = session
    return headers


@dataclass
class Run:
    """What one pass of a conversation through a proxy produced."""

    outcomes: list[tuple[str, ...]]
    forwarded: list[bytes]
    summaries: int
    memory: list[tuple[str, str]]
    decided_known: list[float]
    """Per request, how many requests so far were decided from what is remembered."""
    reasons: dict[str, str]
    """Why each checkpoint (by its order of appearance) was made: trigger, precompute."""


async def drive(
    start: Any,
    script: Script,
    client: Any,
    upstream: FakeUpstream,
    memory_dir: Path,
    dialect: str,
    requests: list[list[dict[str, Any]]],
    *,
    known_mb: float,
    session: str | None = None,
    precompute_ratio: float = 0,
    system_change_at: int | None = None,
    spaced: bool = False,
) -> Run:
    script.upstream.requests.clear()
    proxy = await start(
        upstream={"anthropic_base_url": upstream.base_url},
        models={"default_context_window": WINDOW},
        compaction={"known_requests_mb": known_mb, "precompute_ratio": precompute_ratio},
        memory={"dir": str(memory_dir)},
    )
    path = {"chat": "chat/completions", "responses": "responses", "anthropic": "messages"}
    url = f"{proxy.url}/v1/{path[dialect]}"
    ids: dict[str, str] = {}
    run = Run([], [], 0, [], [], {})
    idle = len(proxy.app[keys.TASKS])  # the proxy's own watchers
    for step, messages in enumerate(requests):
        system = " Be brief." if system_change_at is not None and step >= system_change_at else ""
        body = body_of(dialect, messages, system, spaced=spaced)
        async with client.post(url, data=body, headers=headers_of(dialect, session)) as response:
            await response.read()
            assert response.status == 200
            got = response.headers
        # The same checkpoint in both passes: ids are random, their order of appearance is not.
        cid = ids.setdefault(got.get("x-compaction-id", "-"), f"#{len(ids)}")
        run.outcomes.append(
            (
                got["x-compaction-status"],
                got["x-compaction-tokens-before"],
                got["x-compaction-tokens-after"],
                got["x-compaction-session"],
                cid,
            )
        )
        await wait_for(lambda: len(proxy.app[keys.TASKS]) == idle)  # precomputes done
        run.decided_known.append(await metric(client, proxy.url, RECOGNIZED, decision="known"))
    records = proxy.app[keys.RECORDS]
    for session_id in {outcome[3] for outcome in run.outcomes}:
        for record in (records.get(session_id) or {"records": []})["records"]:
            if record["id"] in ids:
                run.reasons[ids[record["id"]]] = record["reason"]
    run.forwarded = [r.body for r in script.calls(None)]
    run.summaries = len(script.calls("summary"))
    run.memory = [
        (item["type"], item["content"])
        for file in sorted(memory_dir.glob("*/compaction_flush.jsonl"))
        for item in map(orjson.loads, file.read_text().splitlines())
    ]
    assert script.problems == []
    return run


def assert_same_outcomes(known: Run, full: Run) -> None:
    """Statuses, sessions and checkpoints alike; token figures alike up to rounding (counts are
    remembered per item at calibration 1 and scaled as a sum: the upstream's usage moves the
    calibration here)."""
    assert [(o[0], *o[3:]) for o in known.outcomes] == [(o[0], *o[3:]) for o in full.outcomes]
    for ours, theirs in zip(known.outcomes, full.outcomes, strict=True):
        for mine, other in zip(ours[1:3], theirs[1:3], strict=True):
            assert abs(int(mine) - int(other)) <= 0.01 * int(other), (ours, theirs)


async def metric(client: Any, url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples on /metrics whose labels include `labels`."""
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and all(label in line for label in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


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
    known = await drive(
        start, script, client, upstream, tmp_path / "on", dialect, known_mb=64, **common
    )
    full = await drive(
        start, script, client, upstream, tmp_path / "off", dialect, known_mb=0, **common
    )
    statuses = [outcome[0] for outcome in known.outcomes]
    assert "applied" in statuses and statuses.count("reused") >= 3, statuses
    assert_same_outcomes(known, full)
    assert known.forwarded == full.forwarded
    assert (known.summaries, known.memory) == (full.summaries, full.memory)
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
    known = await drive(
        start, script, client, upstream, tmp_path / "on", dialect, known_mb=64, **common
    )
    full = await drive(
        start, script, client, upstream, tmp_path / "off", dialect, known_mb=0, **common
    )
    assert_same_outcomes(known, full)
    assert known.forwarded == full.forwarded
    assert (known.summaries, known.memory) == (full.summaries, full.memory)
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
    known = await drive(
        start, script, client, upstream, tmp_path / "on", dialect, known_mb=64, **common
    )
    full = await drive(
        start, script, client, upstream, tmp_path / "off", dialect, known_mb=0, **common
    )
    assert known.forwarded == full.forwarded
    assert known.decided_known[-1] >= 2
    statuses = [outcome[0] for outcome in known.outcomes]
    for (before, after), status in zip(
        itertools.pairwise(known.forwarded), statuses[1:], strict=True
    ):
        if status == "reused":
            assert after.startswith(before[: list_end(before, dialect)])
            assert b'", "' in after  # the client's own spacing, not orjson's


def list_end(body: bytes, dialect: str) -> int:
    """Where the forwarded list of `body` closes."""
    open_at = locate_value(body, b'"input"' if dialect == "responses" else b'"messages"')
    items = scan_items(body, open_at) if open_at is not None else None
    assert items is not None
    return items.close
